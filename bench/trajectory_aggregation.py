"""Trajectory aggregation on a multi-turn agent: GRPO update time and reward curve with and without it.

    python bench/trajectory_aggregation.py --out runs/bench-agg --steps 5

The tiny text-to-SQL run (examples/text2sql/train_tiny.py) with retries (``max_tries=3``: a failed
query's error goes back to the agent, which rewrites it), trained twice from the same seed: each call a
sample (``LightningRL()``), then each rollout's retries merged into one sample
(``LightningRL(trajectory_aggregation=True)``). Prints per run: median GRPO update seconds, samples per
step, merged calls, prefix mismatches, the training reward per step and the held-out accuracy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.text2sql.train_tiny import TinyRunConfig, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-aggregation")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    summary = {}
    for aggregate in (False, True):
        name = "aggregated" if aggregate else "per_call"
        result = run(TinyRunConfig(
            output_dir=str(Path(args.out) / name), demos_per_task=4, sft_epochs=25, grpo_steps=args.steps,
            grpo_group_size=args.group, workers=args.workers, max_tries=3, trajectory_aggregation=aggregate,
            seed=args.seed))
        reports = [r or {} for r in result["transitions_report_by_step"]]
        summary[name] = {
            "update_s_median": statistics.median(x for x in result["update_seconds_by_step"] if x is not None),
            "samples_per_step": result["transitions_by_step"],
            "calls_per_step": [r.get("calls") for r in reports],
            "merged_per_step": [r.get("merged", 0) for r in reports],
            "prefix_mismatch": {k: sum(r.get(k, 0) for r in reports) for r in reports for k in r
                                if k.startswith("prefix_mismatch_")},
            "reward_by_step": [round(x, 3) for x in result["train_reward_by_step"] if x is not None],
            "val_after_sft": result["val_after_sft"],
            "val_after_grpo": result["val_after_grpo"],
            "seconds": round(result["seconds"], 1),
        }
        print(name, json.dumps(summary[name]), flush=True)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
