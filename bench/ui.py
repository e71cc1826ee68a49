"""Viewer latency: each page's API calls on a store of 1M spans (10k rollouts x 100 spans, the layout of
bench/decompose.py), through a DuckDB file (read-only) and through a running collector.

Timed (median of --rounds HTTP requests against `spanrl ui`'s app on uvicorn, in this process):
  rollouts        the list page's poll: counts by status + 200 rows, sorted (cache warm, no new spans)
  rollouts-cold   the first list request: aggregates every span (once per viewer start)
  rollouts-live   the poll right after one new rollout (100 spans) was committed (incremental refresh;
                  collector only, a read-only file sees no new spans)
  filter          text filter + sort by reward
  rollout         one rollout first opened: spans, decomposed calls with tokens, rewards (a new rollout
                  each round: the viewer remembers decompositions until the rollout's spans change)
  credit          its transitions: load_transitions over its task group (8 rollouts), first time
  rollout-again   the same rollout opened again (remembered), and credit-again likewise
  runs            the run page (history of one run + policy versions over time from the store)
  sql             a small SQL box query (GROUP BY over the rollouts view)
Also, as the floor of `rollout` on this machine at this load: the decomposer's own statement on one
rollout's 100 spans in memory (store/decomposer.py, which the viewer runs and does not own).

Usage:  .venv/bin/python bench/ui.py [--rollouts 10000] [--rounds 7] [--db PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_MS = 300.0


def _decompose_bench():
    spec = importlib.util.spec_from_file_location("bench_decompose", ROOT / "bench" / "decompose.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _get(url: str, path: str, body: dict | None = None) -> float:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url.rstrip("/") + path, data=data, headers={"content-type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as resp:
        resp.read()
    return (time.perf_counter() - t) * 1000


def _median(url: str, path: str, rounds: int, body: dict | None = None) -> float:
    return statistics.median(_get(url, path, body) for _ in range(rounds))


def _run_dir(folder: Path) -> Path:
    run = folder / "grpo"
    run.mkdir(parents=True, exist_ok=True)
    rows = [{"step": s, "reward_mean": s / 50, "val_success": s / 60, "losses/approx_kl": 0.01, "losses/entropy": 1.0,
             "losses/clipfrac": 0.1, "policy_version": s} for s in range(1, 51)]
    (run / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _measure(label: str, url: str, rounds: int, rids: list[str], live=None) -> dict[str, float]:
    out = {"rollouts-cold": _get(url, "/api/rollouts?limit=200")}
    out["rollouts"] = _median(url, "/api/rollouts?limit=200", rounds)
    if live is not None:
        samples = []
        for i in range(rounds):
            live(i)
            samples.append(_get(url, "/api/rollouts?limit=200"))
        out["rollouts-live"] = statistics.median(samples)
    out["filter"] = _median(url, "/api/rollouts?q=t0012&sort=final_reward&limit=200", rounds)
    first = [(_get(url, f"/api/rollout?id={rid}"), _get(url, f"/api/credit?id={rid}")) for rid in rids]
    out["rollout"] = statistics.median(a for a, _ in first)
    out["credit"] = statistics.median(b for _, b in first)
    out["rollout-again"] = _median(url, f"/api/rollout?id={rids[0]}", rounds)
    out["credit-again"] = _median(url, f"/api/credit?id={rids[0]}", rounds)
    out["runs"] = _median(url, "/api/runs", rounds)
    out["sql"] = _median(url, "/api/sql", rounds, {"sql": "SELECT status, count(*) AS n FROM rollouts GROUP BY status"})
    print(f"{label}:")
    for name, value in out.items():
        flag = "" if value <= BUDGET_MS or name == "rollouts-cold" else f"   over {BUDGET_MS:.0f} ms"
        print(f"  {name:14s} {value:8.1f} ms{flag}")
    return out


def _decomposer_floor(db: str, rounds: int, n_rollouts: int) -> None:
    from spanrl.store.decomposer import Selection, decompose
    from spanrl.ui.source import open_source
    from spanrl.ui.subset import Scratch, fetch_spans

    source, scratch = open_source(db=db, url=None, token=None), Scratch()
    samples = []
    for i in range(rounds):
        rid = f"r{n_rollouts // 8 + 9 * i:06d}"
        spans = fetch_spans(source, [rid])
        with scratch.holding(spans) as cur:
            t = time.perf_counter()
            decompose(cur, Selection(rollout_ids=[rid]))
            samples.append((time.perf_counter() - t) * 1000)
    scratch.close()
    source.close()
    print(
        f"floor: the decomposer alone on one rollout's {spans.num_rows} spans in memory: median "
        f"{statistics.median(samples):.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--db", default=None, help="keep the generated store here (default: a tmp dir)")
    args = parser.parse_args(argv)

    from spanrl.collector import Collector, CollectorConfig
    from spanrl.store import SpanStore
    from spanrl.ui.server import UiServer

    dec = _decompose_bench()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or str(Path(tmp) / "ui.duckdb")
        if not os.path.exists(db):
            t = time.perf_counter()
            with SpanStore.open(db) as store:
                store.append(dec.generate(args.rollouts))
            print(f"generated {args.rollouts * dec.SPANS_PER_ROLLOUT:,} spans in {time.perf_counter() - t:.1f} s")
        run = _run_dir(Path(tmp))
        print(f"load before: {os.getloadavg()[0]:.1f} (1-min average, {os.cpu_count()} cores)")
        _decomposer_floor(db, args.rounds, args.rollouts)
        # different tasks for each round and each source (nothing remembered between them)
        rids = [f"r{args.rollouts // 4 + 9 * i:06d}" for i in range(2 * args.rounds)]

        server = UiServer.from_args(db=db, url="http://127.0.0.1:9", runs=[str(run)], port=0).start()
        try:
            _measure(f"file {db} (read-only)", server.url, args.rounds, rids[: args.rounds])
        finally:
            server.shutdown()

        collector = Collector(CollectorConfig(db_path=db, grpc_port=0, http_port=0)).start()
        extra = dec.generate(args.rounds, seed=1)
        try:
            server = UiServer.from_args(db=db, url=collector.http_endpoint, runs=[str(run)], port=0).start()

            def live(i: int) -> None:
                import pyarrow.compute as pc

                one = extra.filter(pc.equal(extra.column("rollout_id"), f"r{i:06d}"))
                one = one.set_column(one.schema.get_field_index("rollout_id"), "rollout_id",
                                     pc.binary_join_element_wise("live-", one.column("rollout_id"), ""))
                collector.store.append(one)

            try:
                _measure(f"collector {collector.http_endpoint}", server.url, args.rounds, rids[args.rounds :], live)
            finally:
                server.shutdown()
        finally:
            collector.shutdown()
        print(f"load after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
