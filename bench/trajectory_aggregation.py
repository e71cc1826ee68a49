"""Trajectory aggregation on a multi-turn agent: GRPO update time and reward curve with and without it.

    python bench/trajectory_aggregation.py --out runs/bench-agg --steps 5

The tiny text-to-SQL run (examples/text2sql/train_tiny.py) with retries (``max_tries=3``: a failed
query's error goes back to the agent, which rewrites it), trained twice from the same seed: each call a
sample (``LightningRL()``), then each rollout's retries merged into one sample
(``LightningRL(trajectory_aggregation=True)``). Prints per run: median GRPO update seconds, samples per
step, merged calls, prefix mismatches, the training reward per step and the held-out accuracy.

The update time inside those runs moves with the machine's load, so ``--updates-only`` then times the
GRPO update alone on one fixed batch of stored rollouts (the per-call run's last step), with and
without aggregation, interleaved, from the same warm-start weights each time (medians and their ratio).
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


def time_updates(out: Path, reps: int) -> dict[str, object]:
    """Median GRPO update seconds on one stored step's rollouts, each call a sample vs merged."""
    import torch

    from spanrl.algorithms import GRPO, LightningRL
    from spanrl.algorithms.transitions import load_training_batch
    from spanrl.store import SpanStore

    run_dir = out / "per_call"
    history = [json.loads(line) for line in (run_dir / "grpo" / "history.jsonl").read_text().splitlines()]
    last = max(row["step"] for row in history if "reward_mean" in row)
    checkpoint = run_dir / "sft" / "checkpoint-1"
    torch.set_num_threads(1)
    store = SpanStore.open(run_dir / "spans.duckdb", read_only=True)
    ids = store.sql(f"SELECT rollout_id FROM rollouts WHERE rollout_id LIKE '%-s{last}-%'").column(0).to_pylist()
    seconds: dict[str, list[float]] = {"per_call": [], "aggregated": []}
    sizes = {}
    for _ in range(reps):
        for name, aggregate in (("per_call", False), ("aggregated", True)):
            algo = GRPO(learning_rate=3e-4)
            algo.setup(model_path=checkpoint, output_dir=out / "updates" / name, seed=0)
            batch = load_training_batch(store, algo, credit=LightningRL(trajectory_aggregation=aggregate),
                                        rollout_ids=ids)
            sizes[name] = (len(batch), batch.report["calls"], batch.report["merged"])
            seconds[name].append(algo.update(batch)["charts/update_seconds"])
    medians = {k: statistics.median(v) for k, v in seconds.items()}
    return {"step": last, "rollouts": len(ids), "samples_calls_merged": sizes, "seconds": seconds,
            "median_s": medians, "ratio_aggregated_over_per_call": medians["aggregated"] / medians["per_call"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-aggregation")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--updates-only", action="store_true", help="only time updates on the stored runs")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    if args.updates_only:
        print(json.dumps(time_updates(Path(args.out), args.reps), indent=1))
        return 0
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
