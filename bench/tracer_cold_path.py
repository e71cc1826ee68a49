"""spanrl's code on the agent's thread, piece by piece, between real HTTP calls (cold caches), against
another spanrl in the same run.

The breakdown (`tracer_overhead.py --breakdown-only`) prices each part as the difference of two stages of
~1.3 ms CPU each, so a part's noise is about +-15 us at its call counts. Here each piece is timed alone
(the thread's CPU clock around the one call, right after an HTTP call to the fake server; pieces shuffled
call by call; trimmed means), which resolves a microsecond:

  on_end       BatchEncodingSpanProcessor.on_end of a chat span OpenLLMetry made (its snapshot + queue)
  emit_reward  spanrl.emit_reward(1.0) on a provider with spanrl's two processors (the direct route)
  rollout_ids  RolloutSpanProcessor.ids() without baggage (what on_start did for every span before 2026-12-06)

Each version runs in its own process, rounds in turns: this checkout, and with `--baseline-pythonpath DIR`
a wheel of another spanrl unpacked in DIR (see tracer_overhead.py's docstring for making one). The host
moves every figure between rounds (6 -> 13 us for the same piece within minutes), so the ratio is taken
round by round. Each process runs in an empty directory and reports where its spanrl came from; the run
stops if that is not DIR (or this checkout). Run from the checkout, `python -c` used to import its
`spanrl/` folder for both versions: before 2026-12-06 this bench compared the checkout with itself
(ratios of 0.87-0.95: the spread between two processes of one version).
Usage:

    .venv/bin/python bench/tracer_cold_path.py [--calls 1000] [--rounds 4] [--baseline-pythonpath DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import textwrap
from pathlib import Path

from _isolated import check_imported, run_script

ROOT = Path(__file__).resolve().parents[1]
_TIMEOUT_S = 600.0

_SCRIPT = textwrap.dedent(
    """
    import json, os, random, sys, time
    sys.path.insert(0, {tests!r})
    from fake_openai import FakeOpenAI
    import openai
    from openai.resources.chat.completions import Completions
    from opentelemetry import trace
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import spanrl
    from spanrl.instrumentation import rollout_resource_attributes
    from spanrl.instrumentation._processor import attach_rollout_processor
    from spanrl.instrumentation.batch import BatchEncodingSpanProcessor
    from spanrl.instrumentation.config import apply_env_defaults
    from spanrl.instrumentation.exporter import FastOTLPSpanExporter
    from spanrl.instrumentation.instrumentor import SpanRLInstrumentor
    calls = int(sys.argv[1])
    apply_env_defaults()
    provider = TracerProvider(resource=Resource.create({{**rollout_resource_attributes(), "service.name": "b"}}))
    rollout = attach_rollout_processor(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    OpenAIInstrumentor().instrument()
    SpanRLInstrumentor().instrument()
    server = FakeOpenAI(reply="5", delay_s=0.001, record=False).start()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-bench")
    messages = [{{"role": "system", "content": "You are a calculator."}},
                {{"role": "user", "content": "What is 2 + 3?"}}]
    client.chat.completions.create(model="tiny", messages=messages)
    chat_span = memory.get_finished_spans()[-1]  # a real chat span, as OpenLLMetry makes it
    queue = BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint="127.0.0.1:9", insecure=True),
                                       schedule_delay_millis=3_600_000, max_queue_size=10**7,
                                       max_export_batch_size=10**7)
    active = provider._active_span_processor
    active._span_processors = (rollout, queue)  # what spanrl's configurator installs
    bare = Completions.create.__wrapped__  # the call without OpenLLMetry's wrapper
    pieces = {{"nothing": lambda: None, "on_end": lambda: queue.on_end(chat_span),
              "emit_reward": lambda: spanrl.emit_reward(1.0), "rollout_ids": lambda: rollout.ids(None)}}
    names, times, rng, clock = list(pieces), {{k: [] for k in pieces}}, random.Random(0), time.thread_time
    for _ in range(calls):
        rng.shuffle(names)
        for name in names:
            bare(client.chat.completions, model="tiny", messages=messages)
            t0 = clock()
            pieces[name]()
            times[name].append(clock() - t0)
        queue._queue.clear()

    def trimmed_mean(values):
        values = sorted(values)
        cut = len(values) // 20
        return sum(values[cut:len(values) - cut]) / (len(values) - 2 * cut)
    base = trimmed_mean(times["nothing"])
    print("IMPORTED " + spanrl.instrumentation._emit.__file__)
    print("BENCH " + json.dumps({{k: trimmed_mean(v) - base for k, v in times.items() if k != "nothing"}}))
    """
)


def run(calls: int, pythonpath: str | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPANRL_", "OPENAI_", "PYTHONPATH"))}
    env.update(SPANRL_ROLLOUT_ID="bench", **({"PYTHONPATH": pythonpath} if pythonpath else {}))
    out = run_script(_SCRIPT.format(tests=str(ROOT / "tests")), [str(calls)], env, _TIMEOUT_S)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")]
    if out.returncode or not lines:
        raise RuntimeError(f"cold-path run failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    imported = next(ln[len("IMPORTED "):] for ln in out.stdout.splitlines() if ln.startswith("IMPORTED "))
    check_imported(imported, pythonpath or ROOT, "baseline" if pythonpath else "this checkout's")
    return json.loads(lines[-1][len("BENCH "):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="HTTP calls per piece and round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per version, in turns")
    parser.add_argument("--baseline-pythonpath", metavar="DIR", help="another spanrl (an unpacked wheel) to compare")
    args = parser.parse_args(argv)
    versions = {"this": None, **({"baseline": args.baseline_pythonpath} if args.baseline_pythonpath else {})}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
    for r in range(args.rounds):
        for name in (list(versions) if r % 2 else list(versions)[::-1]):
            results[name].append(run(args.calls, versions[name]))
        print(f"  round {r + 1}/{args.rounds}: " + "; ".join(
            f"{name} " + ", ".join(f"{k} {v * 1e6:.1f}" for k, v in results[name][-1].items()) for name in versions)
              + " us", flush=True)
    print(f"\nCPU per call between HTTP calls, median of {args.rounds} rounds (load {os.getloadavg()[0]:.1f}); "
          "ratio: the median of the rounds' this / baseline")
    header = " ".join(f"{name:>12s}" for name in versions)
    print(f"  {'piece':14s} {header}" + ("   ratio" if len(versions) > 1 else ""))
    for piece in results["this"][0]:
        med = {name: statistics.median(r[piece] for r in results[name]) for name in versions}
        ratio = ""
        if "baseline" in versions:  # round by round: the host moves both of a round alike, rounds apart
            ratio = f"  {statistics.median(t[piece] / b[piece] for t, b in zip(*results.values())):6.2f}"
        print(f"  {piece:14s} " + " ".join(f"{med[name] * 1e6:9.2f} us" for name in versions) + ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
