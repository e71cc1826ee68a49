"""Decomposer throughput: 1M spans (10k rollouts x 100 spans, 5 LLM calls each with 300 prompt + 60
completion token ids and 60 logprobs) into transitions with advantages, against the anchor.

Spans are generated with numpy and written straight into a DuckDB file through the store's Arrow writer
(`SpanStore.append`), as the collector would have committed them. Each rollout is one trace, depth 5:

    spanrl.rollout > invoke_agent solver > step k > openai.chat (CLIENT) > chat tiny (SERVER, exact ids)
                                          step k > execute_tool > 15 child spans (http, db, ...)
    plus a spanrl.reward span after the last call and 2 more spans under the root: 100 spans.

Timed (median of --rounds; wall and CPU time, `time.process_time`, which counts DuckDB's threads too):
  spanrl   `load_transitions(store, credit=CreditConfig())`: SQL decomposition (calls, rewards, rollouts),
           GRPO credit, the Arrow transitions table. Then store -> padded (B, T) tensors by stage:
           `load_transitions` (its decomposer SQL apart), `check_transitions`, `TransitionBatch.to_padded`,
           end to end against the 0.5 s goal, beside the old per-row path (dataclasses + a tensor per
           row, --old-rounds) in the same run; both must give identical tensors. That is the cold path:
           nothing kept, every rollout decomposed live. Then the kept path: `materialize` (what the
           collector's background thread does as rollouts finish; timed, spans/s), and store -> tensors
           again from the kept rows (store/kept_rollouts.py), identical tensors to the cold path.
  anchor   agentlightning==0.3.0 in its own venv (--anchor-python): the same spans (all, or the first
           --anchor-rollouts rollouts) given to `TracerTraceToTriplet().adapt` one rollout at a time, as
           its trainer does, after converting them to its `Span` objects (timed apart). The LLM call span
           carries the ids under the anchor's attribute names (`prompt_token_ids`, `response_token_ids`).

Usage:
    .venv/bin/python bench/decompose.py [--rollouts 10000] [--rounds 3] [--anchor-rollouts 10000]
        [--old-rounds 1] [--anchor-python /tmp/anchor-venv/bin/python] [--db PATH] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ANCHOR_PYTHON = "/tmp/anchor-venv/bin/python"
SPANS_PER_ROLLOUT = 100
CALLS_PER_ROLLOUT = 5
PROMPT_TOKENS = 300
COMPLETION_TOKENS = 60
TOOL_CHILDREN = 15
T0_NS = 1_800_000_000_000_000_000
STEP_NS = 100_000_000  # 100 ms per step
_ANCHOR_TIMEOUT_S = 3600


def _span_layout() -> list[tuple[str, str, int, str | None]]:
    """One rollout's spans: (name, kind, parent index or -1, role) in creation order."""
    spans: list[tuple[str, str, int, str | None]] = [("spanrl.rollout", "INTERNAL", -1, "root"),
                                                     ("invoke_agent solver", "INTERNAL", 0, "agent")]
    for k in range(CALLS_PER_ROLLOUT):
        step = len(spans)
        spans.append((f"step {k}", "INTERNAL", 1, None))
        client = len(spans)
        spans.append(("openai.chat", "CLIENT", step, "client"))
        spans.append(("chat tiny", "SERVER", client, "server"))
        tool = len(spans)
        spans.append(("execute_tool calc", "INTERNAL", step, "tool"))
        spans.extend((f"child {j}", "INTERNAL", tool, None) for j in range(TOOL_CHILDREN))
    spans.append(("spanrl.reward", "INTERNAL", 1, "reward"))
    while len(spans) < SPANS_PER_ROLLOUT:
        spans.append(("housekeeping", "INTERNAL", 0, None))
    assert len(spans) == SPANS_PER_ROLLOUT
    return spans


def generate(n_rollouts: int, seed: int = 0) -> pa.Table:
    """The spans table rows of ``n_rollouts`` rollouts (columns of store/schema.sql)."""
    rng = np.random.default_rng(seed)
    layout = _span_layout()
    per = len(layout)
    n = n_rollouts * per
    roll = np.repeat(np.arange(n_rollouts), per)
    parent_local = np.tile(np.array([p for _, _, p, _ in layout]), n_rollouts)
    roles = [r for _, _, _, r in layout]
    role = np.tile(np.array([r or "" for r in roles], dtype=object), n_rollouts)
    # times: step k of the rollout starts at k * STEP_NS; the call's client span [10, 60] ms into the step
    call_of_local = np.full(per, -1)
    k = -1
    for i, (name, _, _, _) in enumerate(layout):
        if name.startswith("step "):
            k += 1
        if k >= 0 and name not in ("spanrl.reward", "housekeeping"):
            call_of_local[i] = k
    step_k = np.tile(call_of_local, n_rollouts)
    base = T0_NS + roll.astype(np.int64) * 10 * STEP_NS
    start = base + np.maximum(step_k, 0) * STEP_NS + 10_000_000
    end = start + 50_000_000
    is_root, is_agent = role == "root", role == "agent"
    start = np.where(is_root | is_agent, base, start)
    end = np.where(is_root | is_agent, base + (CALLS_PER_ROLLOUT + 1) * STEP_NS, end)
    is_server = role == "server"
    start = np.where(is_server, start + 1_000_000, start)
    end = np.where(is_server, end - 1_000_000, end)
    is_reward = role == "reward"
    start = np.where(is_reward, base + CALLS_PER_ROLLOUT * STEP_NS + 50_000_000, start)
    end = np.where(is_reward, start, end)

    trace_ids = [f"{r:032x}" for r in range(1, n_rollouts + 1)]
    span_ids = [f"{i + 1:016x}" for i in range(n)]
    parents = [None if p < 0 else span_ids[r * per + p] for r, p in zip(roll.tolist(), parent_local.tolist())]
    rollout_ids = [f"r{r:06d}" for r in range(n_rollouts)]
    is_client = role == "client"
    call_no = roll * CALLS_PER_ROLLOUT + np.maximum(step_k, 0)
    response_ids = [f"chatcmpl-{c}" if (cl or sv) else None
                    for c, cl, sv in zip(call_no.tolist(), is_client.tolist(), is_server.tolist())]
    ops = np.where(is_client | is_server, "chat", np.where(is_agent, "invoke_agent",
                   np.where(role == "tool", "execute_tool", None)))
    n_srv = int(is_server.sum())
    prompt = rng.integers(10, 30_000, size=(n_srv, PROMPT_TOKENS), dtype=np.int32)
    completion = rng.integers(10, 30_000, size=(n_srv, COMPLETION_TOKENS), dtype=np.int32)
    logprobs = -rng.random((n_srv, COMPLETION_TOKENS), dtype=np.float32)
    srv_rows = np.flatnonzero(is_server)

    def _list_col(values: np.ndarray, typ: pa.DataType) -> pa.Array:
        width = values.shape[1]
        offsets = np.zeros(n + 1, dtype=np.int32)
        lengths = np.zeros(n, dtype=np.int32)
        lengths[srv_rows] = width
        offsets[1:] = np.cumsum(lengths)
        mask = ~is_server
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.reshape(-1), typ),
                                        mask=pa.array(mask))

    rewards = rng.integers(0, 2, size=n_rollouts).astype(np.float64)
    reward_value = np.where(is_reward, rewards[roll], np.nan)
    msg = json.dumps([{"role": "user", "parts": [{"type": "text", "content": "what is 3 add 4 " * 8}]}])
    attrs = np.where(is_client, json.dumps({"gen_ai.operation.name": "chat", "gen_ai.input.messages": msg,
                                            "gen_ai.system": "openai"}),
                     np.where(is_server, '{"gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny"}',
                              '{"component": "bench"}'))
    resource = json.dumps({"service.name": "agent"})
    return pa.table({
        "trace_id": pa.array([trace_ids[r] for r in roll.tolist()]),
        "span_id": pa.array(span_ids),
        "parent_span_id": pa.array(parents, pa.string()),
        "name": pa.array(np.tile(np.array([s for s, _, _, _ in layout], dtype=object), n_rollouts).tolist()),
        "kind": pa.array(np.tile(np.array([k for _, k, _, _ in layout], dtype=object), n_rollouts).tolist()),
        "start_ns": pa.array(start, pa.int64()),
        "end_ns": pa.array(end, pa.int64()),
        "status_code": pa.array(["UNSET"] * n),
        "service_name": pa.array(np.where(is_server, "spanrl-policy", "agent").tolist()),
        "rollout_id": pa.array([rollout_ids[r] for r in roll.tolist()]),
        "task_id": pa.array([f"t{r // 8:05d}" for r in roll.tolist()]),
        "attempt": pa.array(np.ones(n, dtype=np.int32)),
        "mode": pa.array(["train"] * n),
        "agent_name": pa.array(np.where(is_agent, "solver", None).tolist(), pa.string()),
        "operation_name": pa.array(ops.tolist(), pa.string()),
        "response_id": pa.array(response_ids, pa.string()),
        "policy_version": pa.array(np.where(is_server, 1, 0).astype(np.int32), mask=~is_server),
        "prompt_token_ids": _list_col(prompt, pa.int32()),
        "completion_token_ids": _list_col(completion, pa.int32()),
        "logprobs": _list_col(logprobs, pa.float32()),
        "reward_value": pa.array(reward_value, pa.float64(), mask=~is_reward),
        "reward_name": pa.array(np.where(is_reward, "reward", None).tolist(), pa.string()),
        "attributes": pa.array(attrs.tolist()),
        "resource": pa.array([resource] * n),
        "events": pa.array([None] * n, pa.string()),
        "links": pa.array([None] * n, pa.string()),
    })


# --- the anchor, in its own venv --------------------------------------------------------------------
_ANCHOR_SCRIPT = textwrap.dedent(
    r"""
    import logging, os, sys, time, json
    logging.disable(logging.WARNING)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import orjson
    from agentlightning.adapter import TracerTraceToTriplet
    from agentlightning.types import Span

    rows = [orjson.loads(line) for line in open(sys.argv[1], "rb")]
    c0 = time.process_time()
    t0 = time.perf_counter()
    by_rollout = {}
    for i, r in enumerate(rows):
        attrs = r["attributes"]
        span = Span(
            rollout_id=r["rollout_id"], attempt_id="a1", sequence_id=i, trace_id=r["trace_id"],
            span_id=r["span_id"], parent_id=r["parent_span_id"], name=r["name"],
            status={"status_code": "UNSET"}, attributes=attrs, events=[], links=[],
            start_time=r["start_ns"] / 1e9, end_time=r["end_ns"] / 1e9,
            context={"trace_id": r["trace_id"], "span_id": r["span_id"], "is_remote": False, "trace_state": {}},
            parent=None if r["parent_span_id"] is None else {
                "trace_id": r["trace_id"], "span_id": r["parent_span_id"], "is_remote": False, "trace_state": {}},
            resource={"attributes": {"service.name": "agent"}, "schema_url": ""},
        )
        by_rollout.setdefault(r["rollout_id"], []).append(span)
    t1, c1 = time.perf_counter(), time.process_time()
    adapter = TracerTraceToTriplet()
    triplets = 0
    for spans in by_rollout.values():
        triplets += len(adapter.adapt(spans))
    t2, c2 = time.perf_counter(), time.process_time()
    print(json.dumps({"spans": len(rows), "rollouts": len(by_rollout), "triplets": triplets,
                      "convert_s": t1 - t0, "adapt_s": t2 - t1, "convert_cpu_s": c1 - c0, "adapt_cpu_s": c2 - c1}))
    """
)


def export_for_anchor(table: pa.Table, path: Path) -> None:
    """The spans as JSON lines with the anchor's attribute names (ids inline, reward as its payload)."""
    import orjson

    with open(path, "wb") as out:
        for r in table.to_pylist():
            attrs = json.loads(r["attributes"])
            if r["kind"] == "SERVER":
                r["name"] = "openai.chat.completion"
                attrs["gen_ai.response.id"] = r["response_id"]
                attrs["prompt_token_ids"] = r["prompt_token_ids"]
                attrs["response_token_ids"] = r["completion_token_ids"]
            elif r["agent_name"] is not None:
                attrs["agent.name"] = r["agent_name"]
            elif r["reward_value"] is not None:
                attrs["agentlightning.reward.0.name"] = r["reward_name"]
                attrs["agentlightning.reward.0.value"] = r["reward_value"]
            row = {k: r[k]
                   for k in ("rollout_id", "trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns")}
            row["attributes"] = attrs
            out.write(orjson.dumps(row) + b"\n")


def run_anchor(python: str, spans_path: Path) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_ANCHOR_SCRIPT)
    try:
        out = subprocess.run([python, f.name, str(spans_path)], capture_output=True, text=True,
                             timeout=_ANCHOR_TIMEOUT_S, env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(f"anchor failed ({out.returncode}): {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _legacy_pad(transitions: list, pad_token_id: int) -> dict:
    """The training path before the columnar one (a dataclass per row, a tensor per row and field), kept
    here as the baseline: the tensors `pad_transitions` must reproduce."""
    import torch

    bsz = len(transitions)
    max_p = max(len(t.prompt_ids) for t in transitions)
    max_c = max(len(t.completion_ids) for t in transitions)
    out = {"prompt_ids": torch.full((bsz, max_p), pad_token_id, dtype=torch.long),
           "prompt_mask": torch.zeros((bsz, max_p), dtype=torch.bool),
           "completion_ids": torch.full((bsz, max_c), pad_token_id, dtype=torch.long),
           "completion_mask": torch.zeros((bsz, max_c), dtype=torch.bool),
           "loss_mask": torch.zeros((bsz, max_c), dtype=torch.bool),
           "old_logprobs": torch.zeros((bsz, max_c), dtype=torch.float32)}
    for i, t in enumerate(transitions):
        p, c = len(t.prompt_ids), len(t.completion_ids)
        out["prompt_ids"][i, max_p - p:] = torch.tensor(t.prompt_ids, dtype=torch.long)
        out["prompt_mask"][i, max_p - p:] = True
        out["completion_ids"][i, :c] = torch.tensor(t.completion_ids, dtype=torch.long)
        out["completion_mask"][i, :c] = True
        out["loss_mask"][i, :c] = torch.tensor(t.completion_mask, dtype=torch.bool)
        out["old_logprobs"][i, :c] = torch.tensor(t.old_logprobs, dtype=torch.float32)
    out["advantages"] = torch.tensor([float(t.advantage) for t in transitions], dtype=torch.float32)
    out["rewards"] = torch.tensor([float(t.reward) for t in transitions], dtype=torch.float32)
    return out


GOAL_S = 0.5  # issue 17: store -> padded tensors for 50k transitions, on a quiet machine
GOAL_TRANSITIONS = 50_000


def _timed(fn: Any) -> tuple[Any, float, float]:
    """``fn()``, its wall time and its CPU time (``time.process_time``: every thread of this process,
    DuckDB's included)."""
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def time_stages(store: object, rounds: int, old_rounds: int, label: str = "cold") -> tuple[dict[str, Any], Any]:
    """Store -> padded (B, T) tensors by stage, median of ``rounds``: `load_transitions` (its decomposer
    SQL timed apart, in the same call) + `check_transitions` + `to_padded`; beside the old per-row path
    (`load_transitions` + a dataclass per row + a tensor per row and field) in the same run, checking
    that both give identical tensors. Returns the figures and the last tensors."""
    import torch

    import spanrl.algorithms.transitions as transitions_module
    from spanrl.algorithms.tables import check_transitions
    from spanrl.algorithms.credit import CreditConfig
    from spanrl.algorithms.transitions import load_transitions

    stages: dict[str, list[tuple[float, float]]] = {k: [] for k in ("sql", "load", "check", "pad", "total")}
    decompose = transitions_module.decompose

    def timed_decompose(*args: Any, **kwargs: Any) -> Any:  # the SQL's share of each load_transitions
        out, wall, cpu = _timed(lambda: decompose(*args, **kwargs))
        stages["sql"].append((wall, cpu))
        return out

    transitions_module.decompose = timed_decompose
    try:
        for _ in range(rounds):
            batch, *load = _timed(lambda: load_transitions(store, credit=CreditConfig()))
            _, *check = _timed(lambda: check_transitions(batch, vocab_size=32_000))
            padded, *pad = _timed(lambda: batch.to_padded(pad_token_id=0))
            stages["load"].append(tuple(load))
            stages["check"].append(tuple(check))
            stages["pad"].append(tuple(pad))
            stages["total"].append((load[0] + check[0] + pad[0], load[1] + check[1] + pad[1]))
    finally:
        transitions_module.decompose = decompose
    rest = [(lw - sw, lc - sc) for (lw, lc), (sw, sc) in zip(stages["load"], stages["sql"])]
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in stages.items()}
    old = []
    for _ in range(old_rounds):
        def old_path() -> dict:
            rows = load_transitions(store, credit=CreditConfig()).transitions  # a dataclass per row
            return _legacy_pad(rows, pad_token_id=0)
        legacy, *timing = _timed(old_path)
        old.append(timing)
    if old_rounds:  # both paths must give identical tensors
        for name, tensor in legacy.items():
            assert torch.equal(getattr(padded, name), tensor), f"columnar {name} differs from the per-row path"
    shape = tuple(padded.prompt_ids.shape), tuple(padded.completion_ids.shape)
    print(f"store -> padded tensors ({label}), {len(batch):,} transitions (prompt {shape[0]}, completion {shape[1]}), "
          f"median of {rounds}, wall / CPU (process_time, all threads):")
    sql, load = med["sql"], med["load"]
    rest_w, rest_c = statistics.median(w for w, _ in rest), statistics.median(c for _, c in rest)
    print(f"  load_transitions                            {load[0]:6.2f} s / {load[1]:5.2f} s, of which")
    print(f"    decomposer SQL (DuckDB -> Arrow)          {sql[0]:6.2f} s / {sql[1]:5.2f} s")
    print(f"    filters, credit, Arrow table              {rest_w:6.2f} s / {rest_c:5.2f} s")
    print(f"  check_transitions                           {med['check'][0]:6.2f} s / {med['check'][1]:5.2f} s")
    print(f"  to_padded (a tensor per field)              {med['pad'][0]:6.2f} s / {med['pad'][1]:5.2f} s")
    total = med["total"]
    print(f"  end to end                                  {total[0]:6.2f} s / {total[1]:5.2f} s "
          f"(rounds: {', '.join(f'{w:.2f}' for w, _ in stages['total'])})")
    if old:
        old_w = statistics.median(w for w, _ in old)
        old_c = statistics.median(c for _, c in old)
        print(f"  old per-row path (dataclasses + a tensor per row), same run: {old_w:.2f} s / {old_c:.2f} s "
              f"-> {old_w / total[0]:.1f}x wall, {old_c / total[1]:.1f}x CPU; identical tensors")
    comparable = len(batch) >= GOAL_TRANSITIONS
    verdict = ("met" if total[0] < GOAL_S else "NOT met") if comparable else "not comparable: fewer transitions"
    print(f"goal ({label}): store -> tensors for 50k transitions under {GOAL_S} s on a quiet machine -> {len(batch):,} "
          f"transitions: {total[0]:.2f} s wall ({verdict} at load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores), {total[1]:.2f} s CPU")
    figures: dict[str, Any] = {"transitions": len(batch), "rounds": rounds, "goal_s": GOAL_S,
                               "goal_met": total[0] < GOAL_S if comparable else None}
    for key, name in (("load", "load_transitions"), ("sql", "decomposer_sql"), ("check", "check_transitions"),
                      ("pad", "to_padded"), ("total", "end_to_end")):
        figures[name] = {"wall_s": med[key][0], "cpu_s": med[key][1]}
    figures["filters_credit_table"] = {"wall_s": rest_w, "cpu_s": rest_c}
    figures["end_to_end"]["rounds_wall_s"] = [w for w, _ in stages["total"]]
    if old:
        figures["old_per_row_path"] = {"wall_s": old_w, "cpu_s": old_c}
    figures["loadavg"] = os.getloadavg()[0]
    return figures, padded


def time_kept(store: Any, n_spans: int, rounds: int, cold: Any) -> dict[str, Any]:
    """What the collector's background thread does beforehand (`materialize`: every rollout here has
    finished), timed, then store -> tensors again from the kept rows: identical tensors to ``cold``."""
    import torch

    from spanrl.store.kept_rollouts import materialize

    done, wall, cpu = _timed(lambda: materialize(store))
    print(f"materialize (the collector does it in the background as rollouts finish): {done['rollouts_kept']:,} "
          f"rollouts in {wall:.2f} s wall / {cpu:.2f} s CPU: {n_spans / wall:,.0f} spans/s")
    figures, padded = time_stages(store, rounds, 0, label="kept rows")
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "loss_mask", "old_logprobs",
                 "advantages", "rewards"):
        assert torch.equal(getattr(padded, name), getattr(cold, name)), f"kept {name} differs from the cold path"
    print("  identical tensors to the cold (live) path")
    figures["materialize"] = {"wall_s": wall, "cpu_s": cpu, "rollouts": done["rollouts_kept"],
                              "spans_per_s": n_spans / wall}
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--anchor-rollouts", type=int, default=None, help="rollouts given to the anchor (default all)")
    parser.add_argument("--anchor-python", default=DEFAULT_ANCHOR_PYTHON)
    parser.add_argument("--old-rounds", type=int, default=1, help="rounds of the old per-row path (slow)")
    parser.add_argument("--db", default=None, help="DuckDB file to write (default: a temporary one)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.db and Path(args.db).exists():
        parser.error(f"--db {args.db} exists: the bench writes a fresh store (remove it or pick another path)")
    figures: dict[str, Any] = {"spans": 0, "rollouts": args.rollouts, "cpu_count": os.cpu_count(),
                               "loadavg_start": os.getloadavg()[0]}

    from spanrl.algorithms.credit import CreditConfig
    from spanrl.algorithms.transitions import load_transitions
    from spanrl.store import SpanStore

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or str(Path(tmp) / "bench.duckdb")
        t0 = time.perf_counter()
        table = generate(args.rollouts)
        t1 = time.perf_counter()
        store = SpanStore.open(db)
        store.append(table)
        t2 = time.perf_counter()
        n_spans = table.num_rows
        print(f"spans: {n_spans:,} ({args.rollouts:,} rollouts); generated in {t1 - t0:.1f} s, "
              f"appended in {t2 - t1:.1f} s ({n_spans / (t2 - t1):,.0f} spans/s)")

        times, cpus, batch = [], [], None
        for _ in range(args.rounds):
            batch, wall, cpu = _timed(lambda: load_transitions(store, credit=CreditConfig()))
            times.append(wall)
            cpus.append(cpu)
        assert batch is not None
        ours_s = statistics.median(times)
        print(f"spanrl load_transitions: {len(batch):,} transitions, median {ours_s:.2f} s of {args.rounds} "
              f"({', '.join(f'{x:.2f}' for x in times)}): {n_spans / ours_s:,.0f} spans/s, "
              f"{len(batch) / ours_s:,.0f} transitions/s")
        print(f"  CPU time of this process (all DuckDB threads), median: {statistics.median(cpus):.2f} s; "
              f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        print(f"  report: {json.dumps({k: v for k, v in batch.report.items() if v})}")
        figures.update(spans=n_spans, load_transitions_runs={"wall_s": ours_s, "cpu_s": statistics.median(cpus)},
                       report=batch.report, loadavg_after_load=os.getloadavg()[0])
        figures["stages"], cold = time_stages(store, args.rounds, args.old_rounds)  # nothing kept: all live
        figures["stages_kept"] = time_kept(store, n_spans, args.rounds, cold)
        figures["loadavg_after_stages"] = os.getloadavg()[0]

        if Path(args.anchor_python).exists():
            figures.update(_anchor_figures(args, table, Path(tmp), ours_s, statistics.median(cpus)))
        else:
            print(f"anchor: skipped, no {args.anchor_python} (pip install agentlightning==0.3.0 into that venv)")
        store.close()
    _write_json(args.json, figures)
    _record_for_report(figures)
    return 0


def _record_for_report(figures: dict[str, Any]) -> None:
    """The figures bench/report.py's README table reads (bench/_results.py; nothing without its env var)."""
    from _results import record

    stages, runs = figures.get("stages") or {}, figures.get("load_transitions_runs") or {}
    old = stages.get("old_per_row_path") or {}
    kept = figures.get("stages_kept") or {}
    mat = kept.get("materialize") or {}
    record("decompose", {
        "spans": figures.get("spans"), "transitions": stages.get("transitions"),
        "load_s": runs.get("wall_s"), "load_cpu_s": runs.get("cpu_s"),
        "tensors_transitions": stages.get("transitions"),
        "tensors_s": (stages.get("end_to_end") or {}).get("wall_s"),
        "tensors_cpu_s": (stages.get("end_to_end") or {}).get("cpu_s"),
        "per_row_s": old.get("wall_s"), "per_row_cpu_s": old.get("cpu_s"),
        "kept_tensors_s": (kept.get("end_to_end") or {}).get("wall_s"),
        "kept_tensors_cpu_s": (kept.get("end_to_end") or {}).get("cpu_s"),
        "materialize_s": mat.get("wall_s"), "materialize_cpu_s": mat.get("cpu_s"),
        "materialize_spans_per_s": mat.get("spans_per_s"),
        "anchor": figures.get("anchor"),
    })


def _anchor_figures(args: argparse.Namespace, table: pa.Table, tmp: Path, ours_s: float, ours_cpu: float) -> dict:
    """Run the anchor on the first --anchor-rollouts rollouts and print the ratios per span."""
    n_spans = table.num_rows
    n_anchor = min(args.anchor_rollouts or args.rollouts, args.rollouts)
    spans_path = tmp / "anchor.jsonl"
    export_for_anchor(table.slice(0, n_anchor * SPANS_PER_ROLLOUT), spans_path)
    res = run_anchor(args.anchor_python, spans_path)
    per_span_adapt = res["adapt_s"] / res["spans"]
    per_span_total = (res["adapt_s"] + res["convert_s"]) / res["spans"]
    print(f"anchor TracerTraceToTriplet on {res['spans']:,} spans ({res['rollouts']:,} rollouts): "
          f"{res['triplets']:,} triplets, adapt {res['adapt_s']:.2f} s ({1 / per_span_adapt:,.0f} spans/s), "
          f"+ converting to its Span objects {res['convert_s']:.2f} s")
    ours_per_span = ours_s / n_spans
    print(f"ratio, wall (anchor time per span / spanrl time per span): adapt only "
          f"{per_span_adapt / ours_per_span:.1f}x, with conversion {per_span_total / ours_per_span:.1f}x")
    ours_cpu_per_span = ours_cpu / n_spans
    cpu_adapt = res["adapt_cpu_s"] / res["spans"] / ours_cpu_per_span
    cpu_total = (res["adapt_cpu_s"] + res["convert_cpu_s"]) / res["spans"] / ours_cpu_per_span
    print(f"ratio, CPU time: adapt only {cpu_adapt:.1f}x, with conversion {cpu_total:.1f}x")
    scaled = "" if n_spans == 1_000_000 else " (scaled linearly from this run; fixed costs dominate small runs)"
    print(f"goal: under 10 s per 1M spans -> {ours_s * 1e6 / n_spans:.2f} s per 1M spans{scaled}")
    return {"anchor": {**res, "ratio_wall_adapt": per_span_adapt / ours_per_span,
                       "ratio_wall_with_conversion": per_span_total / ours_per_span,
                       "ratio_cpu_adapt": cpu_adapt, "ratio_cpu_with_conversion": cpu_total},
            "seconds_per_1m_spans": ours_s * 1e6 / n_spans, "loadavg_end": os.getloadavg()[0]}


def _write_json(path: str | None, figures: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"figures written to {path}")


if __name__ == "__main__":
    sys.exit(main())
