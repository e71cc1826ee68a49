"""Rollout throughput of a command-line agent: one process per rollout (baseline) vs jsonl workers, and
the same jsonl workers as Ray actors on a local Ray cluster of 1 and 2 nodes (``--ray``).

The calculator agent (examples/calculator/agent.py) under opentelemetry-instrument, talking to a
scripted OpenAI-compatible server (tests/fake_openai.py, a stand-in for the model), its spans going to
an in-process collector; a rollout counts once its reward is committed in DuckDB. Prints rollouts/s per
mode (median of REPEATS runs) and the ratio workers / per-process.

    .venv/bin/python bench/rollout_runner.py [--rollouts 32] [--repeats 3] [--workers 4]
    .venv/bin/python bench/rollout_runner.py --ray [--modes workers] [--workers 2]

With ``--ray`` each node of ``ray.cluster_utils.Cluster`` gets ``workers / nodes`` CPUs (one actor each), so
both clusters hold the same number of workers; on one machine's shared cores the 2-node/1-node ratio is
the backend's overhead, not a speed-up. The overhead per rollout is 1/rate(ray) - 1/rate(local) at the
same concurrency.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # Ray's node processes: no gRPC fork notices on screen
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

from spanrl.rollouts.runner import RolloutJob, RolloutRunner, RunnerConfig  # noqa: E402
from spanrl.collector import Collector, CollectorConfig  # noqa: E402


_HEAD_ATTEMPTS = 3
_NODE_START_TIMEOUT_S = 180  # Ray's default 30 s is too short for a second raylet on busy shared cores


def _reply(body: dict) -> str:
    a, op, b = body["messages"][-1]["content"].split()
    return f"<call> {op} {a} {b} </call>"


def _measure(collector: Collector, llm_url: str, *, workers: int, concurrency: int, rollouts: int, tag: str,
             backend: Any = None) -> float:
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
        backend=backend,
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


@contextmanager
def _ray_cluster(nodes: int, cpus: int) -> Iterator[Any]:
    """A local Ray cluster of ``nodes`` nodes (``cpus`` each, no dashboard), shut down after."""
    from ray.cluster_utils import Cluster

    from spanrl.rollouts.rollouts import RolloutsConfig

    args = {"num_cpus": cpus, "object_store_memory": 80 * 2**20}
    for attempt in range(_HEAD_ATTEMPTS):  # Ray gives a raylet a fixed 30 s to register; busy cores miss it
        try:
            cluster = Cluster(initialize_head=True, head_node_args={**args, "include_dashboard": False})
            break
        except Exception as exc:  # Ray raises a bare Exception ("timed out during startup")
            if attempt == _HEAD_ATTEMPTS - 1 or "timed out during startup" not in str(exc):
                raise
            print(f"Ray's head did not start in time ({exc}); trying again", flush=True)
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**args)
        cluster.wait_for_nodes(timeout=_NODE_START_TIMEOUT_S)
        yield RolloutsConfig(backend="ray", address=cluster.address)
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def _ray_main(args: argparse.Namespace) -> None:
    """Each half printed as soon as it is measured (a crash in the Ray half loses nothing)."""
    modes = {"per-process": 0, "workers": args.workers}
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(reply=_reply, record=False) as llm:
        with Collector(CollectorConfig(db_path=str(Path(tmp) / "bench.duckdb"), grpc_port=0, http_port=0)) as collector:
            for mode in args.modes.split(","):
                workers = modes[mode]
                local = _report(f"{mode} local", [_measure(
                    collector, llm.url, workers=workers, concurrency=args.workers, rollouts=args.rollouts,
                    tag=f"{mode}-l{rep}") for rep in range(args.repeats)])
                per_node = {}
                for nodes in (1, 2):
                    with _ray_cluster(nodes, args.workers // nodes) as backend:
                        rate = per_node[nodes] = _report(f"{mode} ray {nodes} node(s)", [_measure(
                            collector, llm.url, workers=workers, concurrency=args.workers, rollouts=args.rollouts,
                            tag=f"{mode}-r{nodes}-{rep}", backend=backend) for rep in range(args.repeats)])
                    print(f"{mode} ray {nodes} node(s): overhead {1000 * (1 / rate - 1 / local):+.0f} ms per rollout "
                          f"(at concurrency {args.workers}), {rate / local:.2f}x the local rate", flush=True)
                print(f"{mode}: 2 nodes / 1 node {per_node[2] / per_node[1]:.2f}x", flush=True)


def _report(name: str, runs: list[float]) -> float:
    median = statistics.median(runs)
    print(f"{name:>26}: {median:7.2f} rollouts/s (median of {len(runs)}; runs {[round(v, 2) for v in runs]})",
          flush=True)
    return median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ray", action="store_true", help="local runner vs the Ray backend on 1 and 2 nodes")
    parser.add_argument("--modes", default="workers", help="with --ray: per-process,workers")
    args = parser.parse_args()
    if args.ray:
        return _ray_main(args)
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
