"""The credit-assignment table of ``agentic.py`` runs: held-out success, first-call success, calls per episode.

Each run folder holds ``result.json`` and ``spans.duckdb``; the held-out figures come from the store with
plain SQL (the evaluations' rollouts are ``mode = 'val'``: the first evaluation is the one before any
training rollout, the last the one after them). "First-call success": the episode ended right without a
wasted call, i.e. at most two LLM calls (one tool call, then the answer) and no tool error.

    python examples/smollm2/compare_credit.py runs/credit-*-s0 runs/credit-*-s1
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import duckdb

EPISODES = """
WITH calls AS (
    SELECT rollout_id, count(*) AS llm_calls FROM llm_calls WHERE prompt_token_ids IS NOT NULL GROUP BY 1),
tool_errors AS (
    SELECT rollout_id, count(*) AS errors FROM spans
    WHERE name LIKE 'execute_tool%' AND status_code = 'ERROR' GROUP BY 1),
train AS (SELECT min(start_ns) AS first, max(start_ns) AS last FROM rollouts WHERE mode = 'train')
SELECT r.start_ns < train.first AS before, r.start_ns > train.last AS after,
       coalesce(r.final_reward, 0) AS reward, coalesce(c.llm_calls, 0) AS llm_calls,
       coalesce(e.errors, 0) AS tool_errors
FROM rollouts r CROSS JOIN train
LEFT JOIN calls c USING (rollout_id) LEFT JOIN tool_errors e USING (rollout_id)
WHERE r.mode = 'val'
"""


def held_out(run: Path) -> dict[str, Any]:
    """Held-out figures of the last evaluation (and success of the first) from the run's store."""
    with duckdb.connect(str(run / "spans.duckdb"), read_only=True) as con:
        rows = con.execute(EPISODES).fetchall()
    after = [r for r in rows if r[1]]
    before = [r for r in rows if r[0]]
    first_call = [r for r in after if r[2] >= 1.0 and r[3] <= 2 and r[4] == 0]
    return {
        "before": statistics.fmean(r[2] for r in before) if before else None,
        "after": statistics.fmean(r[2] for r in after) if after else None,
        "first_call_success": len(first_call) / len(after) if after else None,
        "calls_per_episode": statistics.fmean(r[3] for r in after) if after else None,
        "n": len(after),
    }


def row(run: Path) -> dict[str, Any]:
    result = json.loads((run / "result.json").read_text())
    return {"run": run.name, "credit": result["credit"], "seed": result["config"]["seed"],
            "steps": result["steps"], "minutes": result["seconds"] / 60,
            "train_calls_per_episode": result.get("calls_per_episode"), **held_out(run)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    rows = [row(run) for run in args.runs if (run / "result.json").exists()]
    print("| credit | seed | steps | held-out before -> after | first-call success | calls / held-out episode "
          "| calls / training episode | minutes |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r["credit"], r["seed"])):
        print(f"| {r['credit']} | {r['seed']} | {r['steps']} | {r['before']:.2f} -> {r['after']:.2f} "
              f"| {r['first_call_success']:.2f} | {r['calls_per_episode']:.2f} "
              f"| {r['train_calls_per_episode']:.2f} | {r['minutes']:.1f} |")
    print("\nmean over seeds:")
    for credit in sorted({r["credit"] for r in rows}):
        mine = [r for r in rows if r["credit"] == credit]
        gain = statistics.fmean(r["after"] - r["before"] for r in mine)
        print(f"  {credit:<10} held-out after {statistics.fmean(r['after'] for r in mine):.3f} "
              f"(rise {gain:+.3f}), first-call {statistics.fmean(r['first_call_success'] for r in mine):.3f}, "
              f"{len(mine)} seed(s)")


if __name__ == "__main__":
    main()
