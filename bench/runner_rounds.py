"""How long a batch of rollouts takes to be seen stored, with the runner storing each rollout's end (``on_end``, as the
Trainer's runner does): the calculator agent as 4 jsonl workers against a scripted OpenAI-compatible server, an
in-process collector, the readiness check of the Trainer (``store.rollouts.ready``). Prints the median seconds per
batch and the median latency of one rollout (agent done -> seen stored is the runner's part of it).

    .venv/bin/python bench/runner_rounds.py [--batches 12] [--rollouts 16] [--pythonpath DIR]

``--pythonpath`` times another spanrl (an old commit laid out as a package), in a subprocess.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(batches: int, rollouts: int) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "examples" / "calculator"))
    import calculator
    from fake_openai import FakeOpenAI

    from spanrl.collector import Collector, CollectorConfig
    from spanrl.rollouts.runner import RolloutJob, RolloutRunner, RunnerConfig
    from spanrl.store import rollouts as store_rollouts

    reply = "<call> add 1 2 </call>"
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(reply=lambda _body: reply, record=False) as llm:
        with Collector(CollectorConfig(db_path=str(Path(tmp) / "b.duckdb"), grpc_port=0, http_port=0)) as collector:
            runner = RolloutRunner(
                [sys.executable, str(REPO / "examples" / "calculator" / "agent.py")],
                config=RunnerConfig(workers=4, max_concurrency=8, require_token_spans=False, rollout_timeout_s=120),
                ready=lambda ids, since: store_rollouts.ready(collector.store, ids, since, need_token_ids=False),
                otel_env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.grpc_endpoint}"},
                on_end=functools.partial(store_rollouts.record_ends, collector.store),
            )
            jobs = [RolloutJob(t["id"], t) for t in calculator.make_tasks(rollouts, seed=7)]
            try:
                runner.run(jobs[:4], id_prefix="warm-", llm_url=llm.url, model="m", sampling={})
                seconds, latency = [], []
                for b in range(batches):
                    started = time.perf_counter()
                    results = runner.run(jobs, id_prefix=f"b{b}-", llm_url=llm.url, model="m", sampling={})
                    seconds.append(time.perf_counter() - started)
                    latency += [r.duration_s for r in results]
                    assert all(r.ok for r in results), results
            finally:
                runner.close()
    print(f"batch of {rollouts}: median {statistics.median(seconds):.3f} s over {batches}; "
          f"a rollout: median {1000 * statistics.median(latency):.0f} ms; CPU {time.process_time():.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--pythonpath", default=None)
    args = parser.parse_args()
    if args.pythonpath:
        env = {**os.environ, "PYTHONPATH": args.pythonpath}
        subprocess.run([sys.executable, __file__, "--batches", str(args.batches), "--rollouts", str(args.rollouts)],
                       env=env, check=True)
        return
    _run(args.batches, args.rollouts)


if __name__ == "__main__":
    main()
