"""The credit study on calc-verify (issue 52 item 5): paired seeds, equal budgets, one JSON record per run.

    python examples/smollm2/study.py run --arm identical --seed 0     # one training run, its record saved
    python examples/smollm2/study.py table                            # the table from every saved record

Arms (``ARMS``): ``identical`` (seed s); ``aa``, identical with another Trainer seed (s + ``AA_OFFSET``: the same
training and held-out sets, other task draws and samples: an A/A control of run-to-run noise); ``gigpo`` (GiGPO as
the paper defines it); ``critic`` (the learned value head's GAE term). Every arm gets the same budget (``BUDGET``:
steps, tasks per step, group, tokens; a step budget, not a wall budget, so a loaded machine changes the time, not
the training), and one sample per conversation (aggregation keeps each call's advantage on its tokens,
docs/credit.md).

A record (``study/<arm>-s<seed>.json``) holds the date, the machine's load, the seed, the arm, the held-out
metrics after the last update on 200 greedy held-out tasks (first-try success, final success, calls per episode,
recovery rate; before the first update for ``identical``, which every arm of the seed starts from) and the run's
wall and CPU time. ``table`` prints each arm's mean per metric and, for every arm against ``identical`` on the
seeds both have, the mean paired difference with its 95% t interval (none with fewer than two pairs), then
each per-step arm's verdict by the issue's bar (``verdict``); ``table --plot PNG`` draws the runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STUDY_DIR = Path(__file__).resolve().parent / "study"
AA_OFFSET = 1000
ARMS: dict[str, dict[str, Any]] = {
    "identical": {"credit": "identical"},
    "aa": {"credit": "identical", "aa": True},
    "gigpo": {"credit": "gigpo", "gamma": 0.95},  # the paper's step_gamma
    "critic": {"credit": "critic"},
}
BUDGET = dict(steps=6, tasks_per_step=4, group=8, max_tokens=40, n_val=200, max_minutes=None, eval_every=0,
              prefix_caching=True)
"""Equal for every arm: 6 GRPO steps x 4 tasks x 8 rollouts (192 rollouts), 200 held-out tasks; the policy
server's prefix cache on in every arm (the server's CPU on calc-verify's requests -59%, docs/measurements.md:
what makes the study fit 2 cores)."""
METRICS = ("first_try", "final_success", "calls_per_episode", "recovery_rate")
KEEP_BAR = 0.08
"""An arm earns its keep with held-out first-try success at least this much above ``identical`` (paired mean),
its 95% interval above 0, the A/A gap (the mean absolute paired difference of ``aa`` and ``identical``: the
run-to-run noise) below half of its gain, fewer calls per episode and final success not lower (issue 52 item 5).
Means are rounded to 9 decimals first: scores are counts over 200 tasks, and 0.48 - 0.40 is 0.07999999999999996."""
# two-sided 95% t quantiles by degrees of freedom (1-10, then the normal's)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def record_path(arm: str, seed: int) -> Path:
    return STUDY_DIR / f"{arm}-s{seed}.json"


def run_arm(arm: str, seed: int, out_root: str, threads: int | None) -> dict[str, Any]:
    """Train ``arm`` on ``seed`` with ``BUDGET``; save and return its record."""
    from spanrl.demo.smollm2.verify_run import VerifyConfig, run

    spec = ARMS[arm]
    cfg = VerifyConfig(output_dir=f"{out_root}/{arm}-s{seed}", credit=spec["credit"], gamma=spec.get("gamma", 0.9),
                       seed=seed,
                       sampling_seed=seed + AA_OFFSET if spec.get("aa") else None, threads=threads,
                       eval_before=arm == "identical", progress=False, **BUDGET)
    result = run(cfg)
    record = {
        "arm": arm, "seed": seed, "sampling_seed": cfg.trainer_seed, "credit": cfg.credit, "gamma": cfg.gamma,
        "started_utc": result["started_utc"], "ended_utc": result["ended_utc"], "load_1min": result["load_1min"],
        "budget": BUDGET, "steps_done": result["steps"], "rollouts": result["rollouts"],
        "before": result["before"], "after": result["after"], "n_val": result["n_val"],
        "train_reward_by_step": result["train_reward_by_step"],
        "wall_minutes": round(result["seconds"] / 60, 2), "cpu_minutes": round(result["cpu_seconds"] / 60, 2),
        "command": f"python examples/smollm2/study.py run --arm {arm} --seed {seed}",
    }
    STUDY_DIR.mkdir(exist_ok=True)
    record_path(arm, seed).write_text(json.dumps(record, indent=1) + "\n")
    return record


def load_records(folder: Path = STUDY_DIR) -> dict[tuple[str, int], dict[str, Any]]:
    """Every saved record, by ``(arm, seed)``."""
    records = {}
    for path in sorted(folder.glob("*.json")):
        rec = json.loads(path.read_text())
        records[(rec["arm"], int(rec["seed"]))] = rec
    return records


def paired(diffs: list[float]) -> tuple[float, float | None]:
    """Mean of paired differences and the half-width of its 95% t interval (None with fewer than two)."""
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, None
    return mean, _T95.get(len(diffs) - 1, 1.96) * statistics.stdev(diffs) / math.sqrt(len(diffs))


def table(records: dict[tuple[str, int], dict[str, Any]]) -> str:
    """Markdown: each arm's runs and mean held-out metrics after training, then paired differences against
    ``identical`` with 95% intervals."""
    def value(rec: dict[str, Any], metric: str) -> float | None:
        return (rec.get("after") or {}).get(metric)

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    arms = [a for a in ARMS if any(arm == a for arm, _ in records)]
    lines = ["| arm | seeds | " + " | ".join(METRICS) + " |", "|---" * (len(METRICS) + 2) + "|"]
    for arm in arms:
        seeds = sorted(s for a, s in records if a == arm)
        means = []
        for m in METRICS:
            xs = [v for s in seeds if (v := value(records[(arm, s)], m)) is not None]
            means.append(fmt(statistics.fmean(xs)) if xs else "-")
        lines.append(f"| {arm} | {','.join(map(str, seeds))} | " + " | ".join(means) + " |")
    lines += ["", "| arm - identical (paired) | pairs | " + " | ".join(METRICS) + " |",
              "|---" * (len(METRICS) + 2) + "|"]
    for arm in arms:
        if arm == "identical":
            continue
        seeds = sorted(s for a, s in records if a == arm and ("identical", s) in records)
        if not seeds:
            continue
        cells = []
        for m in METRICS:
            diffs = _diffs(records, arm, m)
            if not diffs:
                cells.append("-")
                continue
            mean, half = paired(diffs)
            mean = round(mean, 9)  # as the verdict reads it
            cells.append(f"{mean:+.3f}" + ("" if half is None else f" [{mean - half:+.3f}, {mean + half:+.3f}]"))
        lines.append(f"| {arm} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _diffs(records: dict[tuple[str, int], dict[str, Any]], arm: str, metric: str) -> list[float]:
    """``arm`` minus ``identical`` on ``metric`` after training, one per seed both have."""
    out = []
    for (a, seed), rec in sorted(records.items()):
        base = records.get(("identical", seed))
        if a == arm and base is not None:
            x, y = (rec.get("after") or {}).get(metric), (base.get("after") or {}).get(metric)
            if x is not None and y is not None:
                out.append(x - y)
    return out


def _mean(xs: list[float]) -> float:
    return round(statistics.fmean(xs), 9)


def verdict(records: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    """One line per per-step arm with runs paired to ``identical``: whether it earns its keep (``KEEP_BAR``),
    and if not, which condition it misses."""
    aa = _diffs(records, "aa", "first_try")
    aa_gap = _mean([abs(d) for d in aa]) if aa else None
    lines = []
    for arm in (a for a in ARMS if a not in ("identical", "aa")):
        gain = _diffs(records, arm, "first_try")
        if not gain:
            continue
        mean, half = paired(gain)
        mean = round(mean, 9)
        calls, final = _diffs(records, arm, "calls_per_episode"), _diffs(records, arm, "final_success")
        checks = (
            (mean >= KEEP_BAR, f"first-try gain {mean:+.3f} < +{KEEP_BAR}"),
            (half is not None and mean - half > 0, "one pair: no interval" if half is None
             else "its 95% interval reaches 0"),
            (aa_gap is not None and aa_gap < mean / 2, "no A/A pair" if aa_gap is None
             else f"A/A gap {aa_gap:.3f} not below half the gain"),
            (bool(calls) and _mean(calls) < 0, "calls per episode not lower" if calls else "no calls per episode"),
            (bool(final) and _mean(final) >= 0, "final success lower" if final else "no final success"),
        )
        misses = [why for ok, why in checks if not ok]
        lines.append(f"{arm}: " + ("earns its keep" if not misses else "does not earn its keep: " + "; ".join(misses))
                     + f" ({len(gain)} pair{'' if len(gain) == 1 else 's'})")
    return lines


def plot(records: dict[tuple[str, int], dict[str, Any]], path: Path) -> Path:
    """A PNG: each arm's training reward per step (mean over its seeds, each seed faint) and its held-out
    first-try and final success after training (each seed a dot, the mean a bar; dashed: before training)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    arms = [a for a in ARMS if any(arm == a for arm, _ in records)]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.0))
    try:
        for i, arm in enumerate(arms):
            color = f"C{i}"
            runs = [rec["train_reward_by_step"] for (a, _), rec in sorted(records.items())
                    if a == arm and rec.get("train_reward_by_step")]
            for ys in runs:
                left.plot(range(1, len(ys) + 1), ys, color=color, alpha=0.2)
            steps = min((len(ys) for ys in runs), default=0)
            left.plot(range(1, steps + 1), [statistics.fmean(ys[t] for ys in runs) for t in range(steps)],
                      color=color, label=f"{arm} ({len(runs)} seeds)")
            for j, metric in enumerate(("first_try", "final_success")):
                xs = [x for (a, _), rec in sorted(records.items())
                      if a == arm and (x := (rec.get("after") or {}).get(metric)) is not None]
                x = j * (len(arms) + 1) + i
                right.bar(x, statistics.fmean(xs) if xs else 0.0, color=color, alpha=0.5)
                right.plot([x] * len(xs), xs, "o", color=color, markersize=3)
        for j, metric in enumerate(("first_try", "final_success")):  # the model every arm of a seed starts from
            base = [b[metric] for (a, _), rec in records.items() if a == "identical" and (b := rec.get("before"))]
            if base:
                right.hlines(statistics.fmean(base), j * (len(arms) + 1) - 0.5, j * (len(arms) + 1) + len(arms) - 0.5,
                             colors="black", linestyles="dashed", label="before training" if j == 0 else None)
        per_step = BUDGET["tasks_per_step"] * BUDGET["group"]
        left.set(xlabel="GRPO step", ylabel=f"training reward (mean of {per_step} rollouts)", ylim=(-0.02, 1.02))
        left.legend(loc="upper left", fontsize=8)
        left.grid(alpha=0.3)
        right.set_xticks([(len(arms) - 1) / 2, len(arms) + 1 + (len(arms) - 1) / 2],
                         ["first-try success", "final success"])
        right.set(ylabel="held-out, greedy, after training", ylim=(0, 1))
        if right.get_legend_handles_labels()[0]:
            right.legend(loc="lower right", fontsize=8)
        right.grid(alpha=0.3, axis="y")
        fig.suptitle("calc-verify credit study (SmolLM2-135M-Instruct)")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return path


_SAMPLES_SQL = """
SELECT rollout_id, list(completion_token_ids ORDER BY start_ns) AS completions
FROM llm_calls WHERE completion_token_ids IS NOT NULL GROUP BY rollout_id
"""  # the policy server's spans carry the tokens; a training rollout is told by its id, not by ``mode``


def same_samples(run_a: Path, run_b: Path) -> dict[int, tuple[int, int]]:
    """Per training step, of the rollouts both run folders made (matched by step and index: the Trainer's
    rollout ids end ``-s<step>-<index>-a<attempt>``), how many sampled the same tokens in every call, and how
    many were compared. Arms of one seed share each rollout's sampling seed, so this shows how far apart
    their policies drifted."""
    import re

    import duckdb

    def samples(run: Path) -> dict[tuple[int, int], list[Any]]:
        with duckdb.connect(str(run / "spans.duckdb"), read_only=True) as con:
            rows = con.sql(_SAMPLES_SQL).fetchall()
        return {(int(m[1]), int(m[2])): comps for rid, comps in rows
                if (m := re.search(r"-s(\d+)-(\d+)-a1$", rid or ""))}

    a, b = samples(run_a), samples(run_b)
    out: dict[int, tuple[int, int]] = {}
    for key in sorted(a.keys() & b.keys()):
        same, n = out.get(key[0], (0, 0))
        out[key[0]] = (same + (a[key] == b[key]), n + 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the calc-verify credit study: runs and their table")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="one training run of an arm on a seed; its record saved in study/")
    r.add_argument("--arm", choices=tuple(ARMS), required=True)
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--out", default="runs/study", help="run folders go under this (default runs/study)")
    r.add_argument("--threads", type=int, default=None)
    t = sub.add_parser("table", help="the table of every record in study/, and each arm's verdict")
    t.add_argument("--plot", type=Path, default=None, help="also draw the runs to this PNG")
    c = sub.add_parser("same-samples", help="per step: rollouts of two finished runs that sampled the same tokens")
    c.add_argument("run_a", type=Path, help="a run folder, e.g. runs/study/identical-s0")
    c.add_argument("run_b", type=Path)
    args = parser.parse_args(argv)
    if args.command == "same-samples":
        for step, (same, n) in same_samples(args.run_a, args.run_b).items():
            print(f"step {step}: {same}/{n} rollouts sampled the same tokens in every call")
        return 0
    if args.command == "table":
        records = load_records()
        print(table(records))
        print("\n".join(["", *verdict(records)]))
        if args.plot is not None:
            print(f"plot: {plot(records, args.plot)}")
        return 0
    from spanrl.logs import log_to_file

    log_to_file(Path(args.out) / f"{args.arm}-s{args.seed}" / "spanrl.log")
    rec = run_arm(args.arm, args.seed, args.out, args.threads)
    print(json.dumps({k: rec[k] for k in ("arm", "seed", "after", "wall_minutes", "cpu_minutes")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
