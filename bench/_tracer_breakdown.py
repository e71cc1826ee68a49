"""Where the tracer's microseconds go, part by part, for `tracer_overhead.py`.

One agent process runs the same OpenAI call stage by stage, each stage adding one part of the tracing
(OpenLLMetry's wrapper and span, spanrl's rollout processor, the chat span's export, the reward span, its
export); a part is the difference of CPU per call between two stages. Every stage runs twice:

* between HTTP calls: each call goes to the fake server (another process) over real HTTP, so every part
  runs in the cache state it has in an agent: the openai client's ~1.2 ms of CPU per call between two
  runs of the tracing code evicts it from the CPU's caches. These are the figures of the verdict.
* in a tight loop: the reply returned in-process (no HTTP), the tracing code hot in the caches. The same
  code costs ~2.3x less there (measured: OpenLLMetry's wrapper 66 us in a loop, 150 us timed between
  HTTP calls; a loop of arithmetic, which touches no memory, costs the same both ways), which is why the
  old in-process breakdown summed to half of the agent's CPU overhead.

Between HTTP calls the stages take turns call by call (the order rotated each round), so a shared
machine's load falls on all alike: CPU of the agent's thread per call, and of each export stage's own
export thread (spanrl's batch processor and exporter; its thread's CPU clock, plus the flush at the end
of the round). An export stage gets one call in six, so its processor waits six times the configured
delay: a request carries the spans of as many calls as an agent making these calls back to back puts in
one (before 2026-12-06 a sixth of them, each call paying six times its share of the request's ~0.5
ms). In the tight loop each stage runs as a block of calls: CPU of every thread, flushed inside the
timed window, and of the agent's thread. An export's agent-thread CPU is its snapshot and queue; the
rest is encoding and gRPC. Figures are medians of rounds.

Probes beside the parts, not in them (between HTTP calls in a round robin of their own, with the
baselines they are compared with, so their code does not make the parts' caches colder): a bare SDK
span given the attributes OpenLLMetry set (the SDK's share of the first part); OpenLLMetry's own
``utils.run_async`` (``asyncio.run`` per call), which spanrl's instrumentor replaces, put back for one
stage in this process only, and inside a running event loop (a thread per call; CPU of every thread);
a bare ``asyncio.run``; and the official contrib instrumentor (``opentelemetry-instrumentation-openai-v2``,
messages on the span), where it is importable.
"""

from __future__ import annotations

import json
import os
import textwrap
from typing import Any

from _isolated import run_script

_TIMEOUT_S = 600.0

_SCRIPT = textwrap.dedent(
    """
    import gc, json, os, random, statistics, sys, time, types
    import openai
    from openai.resources.chat.completions import Completions
    from wrapt import FunctionWrapper
    http_calls, loop_calls, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    grpc, url = sys.argv[4], sys.argv[5]
    import spanrl
    from opentelemetry import trace
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from spanrl.instrumentation.batch import BatchEncodingSpanProcessor
    from spanrl.instrumentation.config import apply_env_defaults
    from spanrl.instrumentation.exporter import FastOTLPSpanExporter
    from spanrl.instrumentation.instrumentor import SpanRLInstrumentor
    apply_env_defaults()  # the default capture: messages, usage, ids
    from spanrl.instrumentation import rollout_resource_attributes
    # as the spanrl configurator builds it: the ids on the resource, the processor reads baggage only
    provider = TracerProvider(resource=Resource.create({**rollout_resource_attributes(), "service.name": "bench"}))
    trace.set_tracer_provider(provider)
    # The official contrib instrumentor (opentelemetry-instrumentation-openai-v2), if importable: its wrapper
    # object is taken and the method unwrapped again before OpenLLMetry wraps it (comparison stages only).
    v2_wrapper, v2_status = None, "not installed"
    try:
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as ContribInstrumentor
        from importlib.metadata import version
        ContribInstrumentor().instrument()
        v2_wrapper = getattr(Completions.create, "_self_wrapper", None)
        ContribInstrumentor().uninstrument()
        v2_status = ("openai-v2 " + version("opentelemetry-instrumentation-openai-v2") + ", util-genai "
                     + version("opentelemetry-util-genai") if v2_wrapper else "instrument() wrapped nothing")
    except ImportError as e:
        missing = e.name and e.name.startswith("opentelemetry.instrumentation.openai_v2")
        v2_status = "not installed" if missing else f"not importable: {e}"
    OpenAIInstrumentor().instrument()
    SpanRLInstrumentor().instrument()
    import asyncio
    from opentelemetry.instrumentation.openai.shared import chat_wrappers
    ours_run_async = chat_wrappers.run_async  # spanrl's instrumentor replaced OpenLLMetry's utils.run_async
    upstream_run_async = getattr(ours_run_async, "_spanrl_original", ours_run_async)

    def with_upstream_run_async(call):
        # MEASUREMENT PROBE, this bench process only: OpenLLMetry's own run_async (asyncio.run per call, a
        # thread per call inside a running loop) put back for one call, to price what spanrl's patch removes.
        def fn():
            chat_wrappers.run_async = upstream_run_async
            try:
                call()
            finally:
                chat_wrappers.run_async = ours_run_async
        return fn

    async def noop():
        pass

    def with_asyncio_run(call):  # the call, then a bare asyncio.run of a coroutine that returns at once
        def fn():
            call()
            asyncio.run(noop())
        return fn
    active = provider._active_span_processor
    rollout = tuple(active._span_processors)
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-bench")
    messages = [{"role": "system", "content": "You are a calculator."}, {"role": "user", "content": "What is 2 + 3?"}]
    class InProcess(Completions):  # the reply without HTTP, behind OpenLLMetry's own wrapper object
        def create(self, *args, **kwargs):
            return REPLY
    InProcess.traced = FunctionWrapper(InProcess.create, Completions.create._self_wrapper)
    chat, local = client.chat.completions, InProcess(client)
    bare = Completions.create.__wrapped__
    REPLY = bare(chat, model="tiny", messages=messages)  # the server's own reply, parsed once
    from opentelemetry import propagate
    from spanrl.instrumentation._propagate import with_context_headers

    # SPANRL_CAPTURE=lean: no OpenAI instrumentor, the context headers only (instrumentation/_propagate.py),
    # on the same client as the plain stage (its header builder swapped for the call)
    lean_headers = types.MethodType(with_context_headers(type(client)._build_headers), client)

    def lean_http():
        client._build_headers = lean_headers
        try:
            bare(chat, model="tiny", messages=messages)
        finally:
            del client._build_headers
    lean = {"http": lean_http,
            "loop": lambda: (propagate.inject({}), local.create(model="tiny", messages=messages))}
    calls = {"http": (lambda: bare(chat, model="tiny", messages=messages),
                      lambda: chat.create(model="tiny", messages=messages)),
             "loop": (lambda: local.create(model="tiny", messages=messages),
                      lambda: local.traced(model="tiny", messages=messages))}
    contrib = {}
    if v2_wrapper is not None:
        class ContribCompletions(Completions):  # real HTTP behind the contrib wrapper
            create = FunctionWrapper(bare, v2_wrapper)
        InProcess.contrib = FunctionWrapper(InProcess.create, v2_wrapper)
        contrib_chat = ContribCompletions(client)
        contrib = {"http": lambda: contrib_chat.create(model="tiny", messages=messages),
                   "loop": lambda: local.contrib(model="tiny", messages=messages)}

    def with_reward(call):
        def fn():
            call()
            spanrl.emit_reward(1.0)
        return fn

    def thread_cpu(thread):  # CPU seconds of another thread (the export threads)
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))

    # Exports of the two export stages go through processors of their own, so each export thread's CPU
    # is known (the rest of a round's spans are flushed on this thread, timed, and added to it).
    # Between HTTP calls an export stage gets one call in ROUND_ROBIN, so its processor waits ROUND_ROBIN
    # times the configured delay: each request then carries the spans an agent making these calls back to
    # back would send in one. (A request costs ~0.5 ms of CPU with cold caches: ~2 us a call at the agent's
    # rate; at the configured delay it was ROUND_ROBIN times that, a bench artifact, before 2026-12-06.)
    ROUND_ROBIN = 6  # the stages of stage_list(), asserted below (the probes' round robin has 6-8: its export
    # stages, beside the parts, send 6/8 of an agent's batch where the contrib instrumentor is installed)
    delay_ms = ROUND_ROBIN * int(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", "5000"))

    def export_processor():  # what export_span_processor() makes, with that delay
        return BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint=grpc, insecure=True),
                                          schedule_delay_millis=delay_ms)
    exporting = {"call_export": export_processor(), "call_export_reward": export_processor(),
                 "lean_export_reward": export_processor()}
    if contrib:
        exporting["v2_export_reward"] = export_processor()

    # The SDK's share of the first part: a bare SDK span with the very attributes OpenLLMetry set on one call
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    captured = InMemorySpanExporter()
    active._span_processors = (SimpleSpanProcessor(captured),)
    calls["http"][1]()
    chat_span = captured.get_finished_spans()[-1]
    chat_attributes, chat_name = dict(chat_span.attributes), chat_span.name
    if contrib:  # what the contrib span carries (messages on the span only with SPAN_ONLY capture)
        contrib["http"]()
        v2_keys = set(captured.get_finished_spans()[-1].attributes)
        v2_status += f"; {len(v2_keys)} attributes, messages on the span: " + (
            "yes" if {"gen_ai.input.messages", "gen_ai.output.messages"} <= v2_keys else "NO")
    active._span_processors = rollout
    sdk_tracer = trace.get_tracer("bench")

    def with_sdk_span(call):
        def fn():
            with sdk_tracer.start_as_current_span(chat_name, kind=trace.SpanKind.CLIENT) as span:
                call()
                for key, value in chat_attributes.items():
                    span.set_attribute(key, value)
        return fn

    def stage_list(where):
        plain, traced = calls[where]
        return {"plain": (plain, ()), "call_bare_sdk": (traced, ()), "call": (traced, rollout),
                "call_export": (traced, rollout + (exporting["call_export"],)),
                "call_export_reward": (with_reward(traced), rollout + (exporting["call_export_reward"],)),
                "lean_export_reward": (with_reward(lean[where]), rollout + (exporting["lean_export_reward"],))}

    def probe_list(where):
        # Their own round robin between HTTP calls (with the baselines they are compared with), so their
        # code does not evict the parts' code from the caches more than an agent's would.
        plain, traced = calls[where]
        main = stage_list(where)
        return {"plain": main["plain"], "call_bare_sdk": main["call_bare_sdk"],
                "call_export_reward": main["call_export_reward"],
                "call_upstream_run_async": (with_upstream_run_async(traced), ()),
                "plain_asyncio_run": (with_asyncio_run(plain), ()),
                "plain_sdk_span": (with_sdk_span(plain), ()),
                **({"v2_bare_sdk": (contrib[where], ()),
                    "v2_export_reward": (with_reward(contrib[where]), rollout + (exporting["v2_export_reward"],))}
                   if contrib else {})}

    def flush_all():
        out = {}
        for name, proc in exporting.items():
            t0 = time.thread_time()
            proc.force_flush(30000)
            out[name] = time.thread_time() - t0
        return out

    collections = [0]
    gc.callbacks.append(lambda phase, info: phase == "start" and collections.__setitem__(0, collections[0] + 1))

    def trimmed_mean(values):
        # The mean of the middle 90%: a call the kernel interrupted, or another process preempted
        # (its caches then colder than any stage makes them), weighs no more than a typical one.
        values = sorted(values)
        cut = len(values) // 20
        middle = values[cut:len(values) - cut] or values
        return sum(middle) / len(middle)

    def round_robin(stages, n, rng):
        # Between HTTP calls: one call of each stage in turn, in a new random order each turn, so the
        # load of a shared machine falls on every stage alike and every stage follows the others alike.
        # CPU of this thread per call, per stage (trimmed mean). A call during which the garbage
        # collector ran is left out (a full collection costs milliseconds and lands on whichever stage
        # allocates next); the agent's collections are measured end to end.
        names = list(stages)
        times = {k: [] for k in names}
        flush_all()
        workers = {k: p._worker for k, p in exporting.items() if k in stages}
        before = {k: thread_cpu(w) for k, w in workers.items()}
        clock = time.thread_time
        for _ in range(n):
            rng.shuffle(names)
            for name in names:
                fn, procs = stages[name]
                active._span_processors = procs
                seen = collections[0]
                t0 = clock()
                fn()
                t1 = clock()
                if collections[0] == seen:
                    times[name].append(t1 - t0)
        flushed = flush_all()
        own = {k: trimmed_mean(v) for k, v in times.items()}
        total = dict(own)
        for k, w in workers.items():
            total[k] += (thread_cpu(w) - before[k] + flushed[k]) / n
        return total, own

    def block(fn, processors, n):
        # In a tight loop: n calls of one stage; the export thread's CPU is the process's less this thread's.
        active._span_processors = processors
        fn(); fn()
        flush_all()
        c0, t0 = time.process_time(), time.thread_time()
        for _ in range(n):
            fn()
        t1 = time.thread_time()
        flush_all()  # the rest of the export, on this thread: counted as export thread
        return (time.process_time() - c0) / n, (t1 - t0) / n

    def in_running_loop(n, rng):
        # An agent whose event loop is running calls the sync client from a coroutine: OpenLLMetry's own
        # run_async then starts and joins a thread per call. CPU of every thread (the hook's thread included;
        # no export processor, so no other thread works), calls taking turns as in round_robin.
        plain, traced = calls["http"]
        stages = {"plain": plain, "call_bare_sdk": traced, "call_upstream_run_async": with_upstream_run_async(traced)}
        active._span_processors = ()

        async def agent():
            names, times = list(stages), {k: [] for k in stages}
            for _ in range(n):
                rng.shuffle(names)
                for name in names:
                    seen, t0 = collections[0], time.process_time()
                    stages[name]()
                    t1 = time.process_time()
                    if collections[0] == seen:
                        times[name].append(t1 - t0)
            return {k: trimmed_mean(v) for k, v in times.items()}
        flush_all()
        return asyncio.run(agent())

    assert len(stage_list("http")) == ROUND_ROBIN
    rng = random.Random(0)
    out, agent = {}, {}  # CPU per call of all threads, and of the agent's own thread, per round
    http, probes, loop = stage_list("http"), probe_list("http"), {**stage_list("loop"), **probe_list("loop")}
    for r in range(rounds):
        for prefix, stages in (("http:", http), ("probe:", probes)):
            total, own = round_robin(stages, http_calls, rng)
            for k in stages:
                out.setdefault(prefix + k, []).append(total[k])
                agent.setdefault(prefix + k, []).append(own[k])
        for k, (fn, procs) in loop.items():
            t, o = block(fn, procs, loop_calls)
            out.setdefault("loop:" + k, []).append(t)
            agent.setdefault("loop:" + k, []).append(o)
        for k, v in in_running_loop(max(1, http_calls // 2), rng).items():
            out.setdefault("running_loop:" + k, []).append(v)
    result = {k: statistics.median(v) for k, v in out.items()}
    result.update({k + "_agent_thread": statistics.median(v) for k, v in agent.items()})
    result["v2_status"] = v2_status
    result["chat_attributes"] = len(chat_attributes)
    result["imported"] = spanrl.instrumentation._emit.__file__  # where the agent-side code came from
    print("BENCH " + json.dumps(result), flush=True)
    """
)

WHERE = {"http": "between HTTP calls", "loop": "tight loop"}


def run_breakdown(grpc: str, url: str, http_calls: int, loop_calls: int, rounds: int,
                  env: dict[str, str]) -> dict[str, Any]:
    """Median CPU seconds per call of each stage (``http:<stage>`` and ``loop:<stage>``)."""
    out = run_script(_SCRIPT, [str(http_calls), str(loop_calls), str(rounds), grpc, url], env, _TIMEOUT_S)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"breakdown failed (rc {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][len("BENCH "):])


def breakdown_parts(b: dict[str, float], where: str = "http") -> list[tuple[str, float]]:
    """(part, CPU seconds per call) of the per-call overhead, from the stages run ``where``."""
    def cpu(stage: str, thread: bool = False) -> float:
        return b[f"{where}:{stage}" + ("_agent_thread" if thread else "")]

    def split(stage: str, base: str) -> tuple[float, float]:  # (agent thread, export thread) of an export
        agent = cpu(stage, True) - cpu(base, True)
        return agent, (cpu(stage) - cpu(base)) - agent

    chat_agent, chat_thread = split("call_export", "call")
    reward_agent, reward_thread = split("call_export_reward", "call_export")
    return [
        ("OpenLLMetry wrapper + chat span (capture on; SDK, no processor)", cpu("call_bare_sdk") - cpu("plain")),
        ("spanrl rollout span processor (on_start)", cpu("call") - cpu("call_bare_sdk")),
        ("chat span export: snapshot + queue (agent thread)", chat_agent),
        ("chat span export: encode + gRPC (export thread)", chat_thread),
        # spanrl.emit_reward writes its span straight into the export queue (instrumentation/_direct.py)
        ("reward span (spanrl.emit_reward): built + queued (agent thread)", reward_agent),
        ("reward span export: encode + gRPC (export thread)", reward_thread),
    ]


def spanrl_own(b: dict[str, float], where: str = "http") -> float:
    """CPU seconds per call of spanrl's own parts: all but OpenLLMetry's wrapper and its SDK span."""
    return parts_total(b, where) - (b[f"{where}:call_bare_sdk"] - b[f"{where}:plain"])


def lean_total(b: dict[str, float], where: str = "http") -> float:
    """CPU seconds per call of the lean capture profile: context headers, the reward span and its export."""
    return b[f"{where}:lean_export_reward"] - b[f"{where}:plain"]


def asyncio_rows(b: dict[str, Any]) -> list[tuple[str, float, float | None]]:
    """(row, CPU seconds per call between HTTP calls, in a tight loop or None) of OpenLLMetry's per-call
    ``asyncio.run``: NOT in the parts (spanrl's instrumentor replaces its ``utils.run_async``); the bench
    puts the upstream function back for one stage to price it."""
    def diff(where: str, stage: str, base: str) -> float:
        return b[f"{where}:{stage}"] - b[f"{where}:{base}"]

    rows: list[tuple[str, float, float | None]] = [
        ("OpenLLMetry's own run_async would add (asyncio.run per call)",
         diff("probe", "call_upstream_run_async", "call_bare_sdk"),
         diff("loop", "call_upstream_run_async", "call_bare_sdk")),
        ("a bare asyncio.run(coroutine that returns at once)",
         diff("probe", "plain_asyncio_run", "plain"), diff("loop", "plain_asyncio_run", "plain")),
    ]
    if "running_loop:plain" in b:
        rows += [
            ("in a running loop: OpenLLMetry wrapper + span (all threads)",
             diff("running_loop", "call_bare_sdk", "plain"), None),
            ("in a running loop: its own run_async would add (thread per call)",
             diff("running_loop", "call_upstream_run_async", "call_bare_sdk"), None),
        ]
    return rows


def sdk_split_rows(b: dict[str, Any]) -> list[tuple[str, float, float]]:
    """The first part (OpenLLMetry's wrapper and chat span) split: a bare SDK span given the attributes
    OpenLLMetry set on one call, and the rest, OpenLLMetry's own Python (CPU seconds, both ways)."""
    def both(stage: str, base: str) -> tuple[float, float]:
        return b[f"probe:{stage}"] - b[f"probe:{base}"], b[f"loop:{stage}"] - b[f"loop:{base}"]

    first = both("call_bare_sdk", "plain")

    return [("OpenLLMetry wrapper + chat span (the first part, again)", *first),
            (f"  of which a bare SDK span, the same {int(b.get('chat_attributes', 0))} attributes set",
             *both("plain_sdk_span", "plain")),
            ("  of which OpenLLMetry's own Python (the rest)", *both("call_bare_sdk", "plain_sdk_span"))]


def contrib_rows(b: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(row, CPU seconds per call between HTTP calls, in a tight loop) of the official contrib instrumentor
    (opentelemetry-instrumentation-openai-v2, messages on the span), beside OpenLLMetry's; empty if it did not run."""
    if "probe:v2_bare_sdk" not in b:
        return []

    def both(stage: str) -> tuple[float, float]:
        return b[f"probe:{stage}"] - b["probe:plain"], b[f"loop:{stage}"] - b["loop:plain"]

    return [("openai-v2 wrapper + chat span (SPAN_ONLY content; SDK, no processor)", *both("v2_bare_sdk")),
            ("  vs OpenLLMetry wrapper + chat span", *both("call_bare_sdk")),
            ("all the tracing with openai-v2 (processor, export, reward span)", *both("v2_export_reward")),
            ("  vs all the tracing with OpenLLMetry", *both("call_export_reward"))]


def parts_total(b: dict[str, float], where: str = "http") -> float:
    """CPU seconds per call of all the tracing (equals the sum of ``breakdown_parts``)."""
    return b[f"{where}:call_export_reward"] - b[f"{where}:plain"]


def print_breakdown(b: dict[str, float], call_ms: float, e2e_cpu_s: float | None = None,
                    gc_s: float | None = None, plain_spread_s: float | None = None) -> None:
    """The parts, in microseconds of CPU per call both ways, and how they add up to the end-to-end CPU
    (``e2e_cpu_s``: spanrl's agent less the plain one; ``gc_s``: of that, the extra garbage collection;
    ``plain_spread_s``: how far apart the plain agent's rounds were)."""
    http, loop = breakdown_parts(b, "http"), breakdown_parts(b, "loop")
    total, warm = parts_total(b, "http"), parts_total(b, "loop")
    print(f"\nwhere the microseconds go (CPU per call, median of rounds; load {os.getloadavg()[0]:.1f}):")
    print(f"  {'part':66s} {WHERE['http']:>19s} {WHERE['loop']:>11s}")
    for (name, x), (_, y) in zip(http, loop):
        print(f"  {name:66s} {x * 1e6:16.1f} us {y * 1e6:8.1f} us")
    print(f"  {'total':66s} {total * 1e6:16.1f} us {warm * 1e6:8.1f} us"
          f"  (= {100 * total / (call_ms / 1000):.1f}% / {100 * warm / (call_ms / 1000):.1f}%"
          f" of a {call_ms:.1f} ms call)")
    own, own_warm = spanrl_own(b, "http"), spanrl_own(b, "loop")
    print(f"  {'  of which spanrl own parts (processor, snapshots, encoding, reward span, exports)':66s}"
          f" {own * 1e6:16.1f} us {own_warm * 1e6:8.1f} us")
    lean, lean_warm = lean_total(b, "http"), lean_total(b, "loop")
    print(f"  {'lean capture (SPANRL_CAPTURE=lean: context headers, reward span + export)':66s}"
          f" {lean * 1e6:16.1f} us {lean_warm * 1e6:8.1f} us  (= {100 * lean / (call_ms / 1000):.1f}% of the call)")
    if warm > 0:
        print(f"  between HTTP calls the same code costs {total / warm:.1f}x its tight-loop CPU: the openai client's"
              f" work in between evicts it from the CPU's caches (more so the busier the machine)")
    print("  probes, between HTTP calls in a round robin of their own (beside the baselines they are compared with):")
    for name, x, y in sdk_split_rows(b):
        print(f"    {name:64s} {x * 1e6:16.1f} us {y * 1e6:8.1f} us")
    print("  not in the parts: OpenLLMetry's per-call asyncio.run (upstream utils.run_async; spanrl's instrumentor"
          " replaces it, the probe puts it back for one stage, in this process only):")
    for name, x, y in asyncio_rows(b):
        print(f"    {name:64s} {x * 1e6:16.1f} us " + (f"{y * 1e6:8.1f} us" if y is not None else f"{'-':>11s}"))
    rows = contrib_rows(b)
    print(f"  official contrib instrumentor ({b.get('v2_status', 'not installed')})" + (":" if rows else ""))
    for name, x, y in rows:
        print(f"    {name:64s} {x * 1e6:16.1f} us {y * 1e6:8.1f} us  (= {100 * x / (call_ms / 1000):.1f}% of the call)")
    if e2e_cpu_s is not None:
        gc_part = gc_s or 0.0
        rest = e2e_cpu_s - total - gc_part
        spread = (f"; the plain agent's rounds lie {plain_spread_s * 1e6:.0f} us apart"
                  if plain_spread_s is not None else "")
        print(f"  end to end the agent's CPU overhead is {e2e_cpu_s * 1e6:.0f} us = the parts {total * 1e6:.0f} us"
              f" + more garbage collection {gc_part * 1e6:.0f} us {rest * 1e6:+.0f} us of variation between"
              f" processes (one agent process per round and mode{spread})")


def breakdown_json(b: dict[str, float], call_ms: float) -> dict[str, Any]:
    def figures(where: str) -> tuple[dict[str, float], float]:
        return {name: round(x * 1e6, 2) for name, x in breakdown_parts(b, where)}, round(parts_total(b, where) * 1e6, 2)

    parts, total = figures("http")
    warm_parts, warm_total = figures("loop")
    def us(x: float | None) -> float | None:
        return None if x is None else round(x * 1e6, 2)

    return {"parts_us": parts, "total_us": total, "spanrl_own_us": round(spanrl_own(b) * 1e6, 2),
            "tight_loop_spanrl_own_us": round(spanrl_own(b, "loop") * 1e6, 2),
            "lean_us": round(lean_total(b) * 1e6, 2), "tight_loop_lean_us": round(lean_total(b, "loop") * 1e6, 2),
            "total_pct_of_call": round(100 * total / (call_ms * 1000), 2),
            "tight_loop_parts_us": warm_parts, "tight_loop_total_us": warm_total,
            "first_part_split_us": {name.strip(): {"between_http_calls": us(x), "tight_loop": us(y)}
                                    for name, x, y in sdk_split_rows(b)},
            "openllmetry_asyncio_run_us": {name: {"between_http_calls": us(x), "tight_loop": us(y)}
                                           for name, x, y in asyncio_rows(b)},
            "contrib_openai_v2": {"status": b.get("v2_status", "not installed"),
                                  **{name.strip(): {"between_http_calls": us(x), "tight_loop": us(y),
                                                    "pct_of_call": round(100 * x / (call_ms / 1000), 2)}
                                     for name, x, y in contrib_rows(b)}}}
