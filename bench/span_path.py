"""Which product files a span passes through, from OTLP bytes to the gradient (issue 31: at most 12).

Builds a tiny model, starts the collector, then traces (``sys.setprofile`` on every thread) the three
steps a span's data takes and lists each spanrl file whose code ran, in the order it first ran:

1. ``POST /v1/traces`` with protobuf bytes of four rollouts (two tasks, rewards 0 and 1) until acked;
2. ``load_training_batch``: the decomposer's SQL, credit assignment, the transition table;
3. ``GRPO.update``: padding, log-probs, the loss and its backward pass.

Setup (imports, the model load, the collector's start) runs before tracing starts, so what is listed is the
path of the data, not of the program's start. ``python bench/span_path.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import tomllib
import time
import urllib.request
from pathlib import Path
from typing import Any

# every product folder, as pyproject maps the packages (bench/ runs from the checkout)
_PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
REPO_ROOTS = tuple(sorted({d.split("/")[0] for d in _PYPROJECT["tool"]["setuptools"]["package-dir"].values()}))
# issue 31 brought the path to 12 files; splitting credit.py and grpo.py by job and reading message references
# added 5, splitting collector admission by job 2, the shared ASGI reply 1 (docs/architecture.md says which): a
# newcomer reads a short path, not one packed to stay under a count
MAX_FILES = 21
# the collector's background upkeep (kept rollouts, retention): it runs on its own clock, not on a span's path
_MAINTENANCE_THREADS = ("spanrl-materializer", "spanrl-retention")


def _spans(prompt: list[int]) -> bytes:
    """Four rollouts as the policy server and an agent would export them, encoded as one OTLP request."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from spanrl import semconv as sc

    memory = InMemorySpanExporter()

    def tracer(service: str, **resource: Any) -> trace.Tracer:
        provider = TracerProvider(resource=Resource.create({sc.SERVICE_NAME: service, **resource}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        return provider.get_tracer("span-path")

    server = tracer("spanrl-policy")
    t0 = time.time_ns()
    for i, (task, reward) in enumerate((("t1", 1.0), ("t1", 0.0), ("t2", 0.0), ("t2", 1.0))):
        rid = f"r{i}"
        agent = tracer("agent", **{sc.ROLLOUT_ID: rid, sc.TASK_ID: task, sc.MODE: "train"})
        root = agent.start_span(sc.ROLLOUT_SPAN_NAME, start_time=t0)
        ctx = trace.set_span_in_context(root)
        call = agent.start_span("openai.chat", context=ctx, kind=trace.SpanKind.CLIENT, start_time=t0 + 10,
                                attributes={sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.GEN_AI_RESPONSE_ID: f"c-{rid}"})
        completion = [prompt[(i + j) % len(prompt)] for j in range(4)]
        srv = server.start_span("chat tiny", context=trace.set_span_in_context(call), kind=trace.SpanKind.SERVER,
                                start_time=t0 + 11, attributes={
                                    sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.GEN_AI_RESPONSE_ID: f"c-{rid}",
                                    sc.ROLLOUT_ID: rid, sc.POLICY_VERSION: 0, sc.LLM_PROMPT_TOKEN_IDS: prompt,
                                    sc.LLM_COMPLETION_TOKEN_IDS: completion, sc.LLM_LOGPROBS: [-1.0] * 4})
        srv.end(end_time=t0 + 19)
        call.end(end_time=t0 + 20)
        agent.start_span(sc.REWARD_SPAN_NAME, context=ctx, start_time=t0 + 30,
                         attributes={sc.REWARD_VALUE: reward}).end(end_time=t0 + 30)
        root.end(end_time=t0 + 40)
    return encode_spans(memory.get_finished_spans()).SerializeToString()


class _Trace:
    """Product files whose functions are called while `active`, in first-call order, on every thread.

    Python 3.11 has no "profile every running thread": the profiler is installed before the collector
    starts its threads (``threading.setprofile``) and records only between `step` calls."""

    def __init__(self, repo: Path) -> None:
        self._prefixes = tuple(str(repo / root) + "/" for root in REPO_ROOTS)
        self._repo = repo
        self.files: dict[str, None] = {}
        self.active = False

    def _profile(self, frame: Any, event: str, arg: Any) -> None:
        if self.active and event == "call" and threading.current_thread().name not in _MAINTENANCE_THREADS:
            name = frame.f_code.co_filename
            if name not in self.files and name.startswith(self._prefixes):
                self.files[name] = None

    def __enter__(self) -> "_Trace":
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]

    def step(self, run: Any) -> list[str]:
        """The files ``run()`` passes through (its threads' too)."""
        self.files.clear()
        self.active = True
        try:
            run()
            time.sleep(0.2)  # the collector's writer thread commits after the ack it waits for
        finally:
            self.active = False
        return [str(Path(f).relative_to(self._repo)) for f in self.files]


def trace_path() -> dict[str, list[str]]:
    """Each step's files (in first-call order) and the whole path's, without repeats."""
    import spanrl
    from spanrl.algorithms.grpo import GRPO
    from spanrl.algorithms.transitions import load_training_batch
    from spanrl.collector import Collector, CollectorConfig
    from spanrl.demo.tiny import build_tiny_model

    repo = Path(spanrl.__file__).resolve().parents[1]
    steps: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp, _Trace(repo) as traced:
        model = build_tiny_model(Path(tmp) / "model", words=[f"w{i}" for i in range(40)], hidden_size=32,
                                 num_layers=1, num_heads=2, intermediate_size=64)
        algo = GRPO()
        algo.setup(model_path=model, output_dir=Path(tmp) / "run", seed=0)
        prompt = algo.tokenizer.encode("w1 w2 w3", add_special_tokens=False)
        body = _spans(prompt)
        config = CollectorConfig(db_path=str(Path(tmp) / "spans.duckdb"), grpc_port=-1, http_port=0)
        with Collector(config) as collector:
            request = urllib.request.Request(f"{collector.http_endpoint}/v1/traces", data=body, method="POST",
                                             headers={"Content-Type": "application/x-protobuf"})
            urllib.request.urlopen(request, timeout=30).read()  # warm-up: the first request's lazy imports
            store = collector.store
            load_training_batch(store, algo)
            steps["ingest"] = traced.step(lambda: urllib.request.urlopen(request, timeout=30).read())
            steps["transitions"] = traced.step(lambda: load_training_batch(store, algo))
            batch = load_training_batch(store, algo)
            steps["update"] = traced.step(lambda: algo.update(batch))
    steps["path"] = list(dict.fromkeys(f for files in steps.values() for f in files))
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the list")
    args = parser.parse_args()
    steps = trace_path()
    if args.json:
        print(json.dumps(steps))
        return 0
    for name in ("ingest", "transitions", "update"):
        print(f"{name}: {', '.join(steps[name])}")
    print(f"\n{len(steps['path'])} files from OTLP bytes to the gradient (at most {MAX_FILES}):")
    for i, f in enumerate(steps["path"], 1):
        print(f"{i:3d}. {f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
