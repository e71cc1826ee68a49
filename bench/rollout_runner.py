"""Rollout throughput of a command-line agent: one process per rollout (baseline) vs jsonl workers.

The calculator agent (examples/calculator/agent.py) under opentelemetry-instrument, talking to a
scripted OpenAI-compatible server (tests/fake_openai.py, a stand-in for the model), its spans going to
an in-process collector; a rollout counts once its reward is committed in DuckDB. Prints rollouts/s per
mode (median of REPEATS runs) and the ratio workers / per-process.

    .venv/bin/python bench/rollout_runner.py [--rollouts 32] [--repeats 3] [--workers 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

from spanrl.rollouts.runner import RolloutJob, RolloutRunner, RunnerConfig  # noqa: E402
from spanrl.collector import Collector, CollectorConfig  # noqa: E402


def _reply(body: dict) -> str:
    a, op, b = body["messages"][-1]["content"].split()
    return f"<call> {op} {a} {b} </call>"


def _measure(collector: Collector, llm_url: str, *, workers: int, concurrency: int, rollouts: int, tag: str) -> float:
    store = collector.store

    def ready(ids: list[str], since_ns: int) -> set[str]:
        query = ("SELECT DISTINCT rollout_id FROM spans WHERE ingested_ns >= ? AND reward_value IS NOT NULL AND "
                 "list_contains(?, rollout_id)")
        return set(store.sql(query, [since_ns, list(ids)]).column("rollout_id").to_pylist())

    runner = RolloutRunner(
        [sys.executable, str(REPO / "examples" / "calculator" / "agent.py")],
        config=RunnerConfig(workers=workers, max_concurrency=concurrency, require_token_spans=False,
                            rollout_timeout_s=120),
        ready=ready,
        otel_env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.grpc_endpoint}"},
    )
    jobs = [RolloutJob(t["id"], t) for t in calculator.make_tasks(rollouts, seed=7)]
    try:
        if workers:  # warm the workers up: their start-up is paid once per training run, not per step
            runner.run(jobs[:workers], id_prefix=f"{tag}-warm-", llm_url=llm_url, model="m", sampling={})
        started = time.perf_counter()
        results = runner.run(jobs, id_prefix=f"{tag}-", llm_url=llm_url, model="m", sampling={})
        seconds = time.perf_counter() - started
    finally:
        runner.close()
    failed = [r for r in results if not r.ok]
    if failed:
        raise SystemExit(f"{len(failed)} rollouts failed, e.g. {failed[0]}")
    return rollouts / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(reply=_reply, record=False) as llm:
        with Collector(CollectorConfig(db_path=str(Path(tmp) / "bench.duckdb"), grpc_port=0, http_port=0)) as collector:
            rates: dict[str, list[float]] = {"per-process": [], f"{args.workers} workers": []}
            for rep in range(args.repeats):
                rates["per-process"].append(
                    _measure(collector, llm.url, workers=0, concurrency=args.workers, rollouts=args.rollouts,
                             tag=f"p{rep}")
                )
                rates[f"{args.workers} workers"].append(
                    _measure(collector, llm.url, workers=args.workers, concurrency=args.workers, rollouts=args.rollouts,
                             tag=f"w{rep}")
                )
    medians = {mode: statistics.median(values) for mode, values in rates.items()}
    for mode, value in medians.items():
        print(
            f"{mode:>14}: {value:7.1f} rollouts/s (median of {args.repeats}; runs {[round(v, 1) for v in rates[mode]]})"
        )
    base = medians["per-process"]
    print(f"ratio workers / per-process: {medians[f'{args.workers} workers'] / base:.1f}x")


if __name__ == "__main__":
    main()
