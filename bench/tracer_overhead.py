"""Tracer overhead per LLM call: an agent loop against a local OpenAI-compatible server, with and without
instrumentation, and the anchor (agentlightning==0.3.0) tracer in the same run.

Processes (nothing shares a GIL with the agent being timed):
  server     tests/fake_openai.py, answering each chat completion after a delay so a call takes ~2 ms
  collector  `spanrl collector` on free ports with a temporary DuckDB file
  agent      one fresh process per measurement: N calls of `client.chat.completions.create` + one
             `emit_reward` each, after a warm-up; prints per-call latencies as JSON

Modes:
  plain            spanrl venv, no OTel SDK (emit_reward is a no-op): the baseline
  spanrl           the same script under `opentelemetry-instrument` (spanrl distro: OpenLLMetry spans,
                   BatchEncodingSpanProcessor, OTLP/gRPC to the running collector)
  spanrl-lean      the same with SPANRL_CAPTURE=lean (no OpenAI instrumentor: context headers, reward span)
  anchor-plain     the anchor's venv, no tracer (agentlightning.emit_reward raises without one: no reward)
  anchor           AgentOpsTracer (Agent Lightning 0.3's default tracer) writing each span synchronously
                   to an in-process InMemoryLightningStore (its fastest store: no IPC)

Rounds are interleaved; figures are medians over rounds of each round's median per-call latency.
Overhead = mode - its own venv's baseline. CPU/call is the agent process's CPU time (all threads,
span export included, flushed at the end) over the timed calls: steadier than wall time on a busy
machine. Then the breakdown (`_tracer_breakdown.py`): where the overhead's microseconds go, part by part
in one agent process, each part measured between real HTTP calls (as in an agent: cold caches) and in a
tight loop (hot caches, ~2.3x less), each export split into the agent thread's CPU (snapshot, queue) and
the export thread's (encoding, gRPC). The verdict takes the wall overhead end to end and the CPU of the
parts between HTTP calls. Two probes beside the parts (not in them): OpenLLMetry's own per-call
`asyncio.run` (its `utils.run_async`, which spanrl's instrumentor replaces; the bench puts it back for
one stage), also inside a running event loop (a thread per call); and the official contrib instrumentor
(`opentelemetry-instrumentation-openai-v2`, messages on the span), only where it is importable:
    .venv/bin/python -m pip install opentelemetry-instrumentation-openai-v2==2.4b0 opentelemetry-util-genai==1.1b0
(2.4b0 does not import with util-genai 1.2b0/1.3b0). `--json PATH` writes every figure as one JSON object.

`--baseline-pythonpath DIR` (with --breakdown-only) runs the breakdown of another spanrl beside this one,
round by round in turns, so both meet the same machine: DIR is where a wheel of it is unpacked (the parts
between HTTP calls move by 2-3x with the host's load and its neighbours' use of the shared caches, so only
figures of one run compare). Each breakdown runs in an empty directory and the comparison stops if a
process imported spanrl from anywhere but DIR or this checkout (run from the checkout, `python -c` used to
import its `spanrl/` folder for both versions, before 2026-12-06). For the version before a change:
    git worktree add /tmp/base/src REV && pip wheel --no-deps --no-build-isolation -w /tmp/base/wheel /tmp/base/src
    python -m zipfile -e /tmp/base/wheel/spanrl-*.whl /tmp/base/site   # then --baseline-pythonpath /tmp/base/site
Usage:

    .venv/bin/python bench/tracer_overhead.py [--calls 300] [--rounds 5] [--call-ms 2.0] [--breakdown-only]
        [--breakdown-calls 2000] [--breakdown-http-calls 500] [--anchor-python /tmp/anchor-venv/bin/python]
        [--baseline-pythonpath DIR] [--json PATH]
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
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from _isolated import check_imported
from _tracer_breakdown import (breakdown_json, breakdown_parts, lean_total, parts_total, print_breakdown,
                               run_breakdown, spanrl_own)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEFAULT_ANCHOR_PYTHON = "/tmp/anchor-venv/bin/python"
DEFAULT_CALLS = 300
DEFAULT_WARMUP_CALLS = 30
DEFAULT_ROUNDS = 5
DEFAULT_CALL_MS = 2.0
_START_TIMEOUT_S = 120.0
_AGENT_TIMEOUT_S = 600.0

_SERVER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {tests!r})
    from fake_openai import FakeOpenAI
    server = FakeOpenAI(reply="5", delay_s=float(sys.argv[1]), record=False).start()
    print(server.url, flush=True)
    sys.stdin.read()  # until the parent closes stdin
    """
)

# The agent loop: identical code for every mode; `REWARD` is spanrl's or agentlightning's emit_reward.
_AGENT = textwrap.dedent(
    """
    import gc, json, os, statistics, sys, time
    import openai
    calls, warmup = int(sys.argv[1]), int(sys.argv[2])
    in_gc = [0.0, 0.0]  # seconds in garbage collections, start of the current one

    def gc_timer(phase, info):
        if phase == "start":
            in_gc[1] = time.thread_time()
        else:
            in_gc[0] += time.thread_time() - in_gc[1]
    gc.callbacks.append(gc_timer)
    mode = os.environ["BENCH_MODE"]
    store = tracer = None
    if mode == "anchor":
        import agentlightning as agl
        reward = agl.emit_reward
    elif mode == "anchor-plain":  # agentlightning.emit_reward raises without an active tracer
        reward = lambda value: None
    else:
        import spanrl
        reward = spanrl.emit_reward
    client = openai.OpenAI()
    messages = [{"role": "system", "content": "You are a calculator."}, {"role": "user", "content": "What is 2 + 3?"}]

    def loop(n):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            answer = client.chat.completions.create(model="tiny", messages=messages).choices[0].message.content
            reward(1.0 if answer == "5" else 0.0)
            times.append(time.perf_counter() - t0)
        return times

    def run():
        global cpu_s
        loop(warmup)
        in_gc[0] = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        times = loop(calls)
        wall = time.perf_counter() - t0
        flush()
        cpu_s = time.process_time() - c0  # every thread of the agent process, export included
        return times, wall

    stored = None
    cpu_s = 0.0

    def flush():
        if mode.startswith("spanrl"):
            from spanrl.instrumentation import flush as spanrl_flush
            assert spanrl_flush(30.0), "flush timed out"

    if mode == "anchor":
        import asyncio
        from agentlightning.store.memory import InMemoryLightningStore
        from agentlightning.tracer.agentops import AgentOpsTracer

        async def traced():
            global stored
            store = InMemoryLightningStore()
            tracer = AgentOpsTracer()
            tracer.init()
            tracer.init_worker(0, store)
            rollout = await store.start_rollout(input={"task": "bench"})
            async with tracer.trace_context("bench", rollout_id=rollout.rollout_id,
                                            attempt_id=rollout.attempt.attempt_id):
                result = run()
            stored = len(await store.query_spans(rollout.rollout_id))
            return result
        times, wall = asyncio.run(traced())
    else:
        times, wall = run()
    print("BENCH " + json.dumps({"median_s": statistics.median(times), "mean_s": wall / calls,
                                 "cpu_s": cpu_s / calls, "gc_s": in_gc[0] / calls, "stored": stored}), flush=True)
    """
)


def write_json(path: str | None, figures: dict[str, object]) -> None:
    """The figures as one JSON object in ``path`` and as the last line on stdout (``BENCH_JSON {...}``)."""
    if not path:
        return
    text = json.dumps(figures, sort_keys=True)
    Path(path).write_text(text + "\n")
    print("BENCH_JSON " + text)


def _clean_env(**extra: str) -> dict[str, str]:
    drop = ("OTEL_", "SPANRL_", "TRACELOOP_", "OPENAI_", "AGENTOPS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _read_line(proc: subprocess.Popen[str], what: str) -> str:
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    reader.join(_START_TIMEOUT_S)
    if not line or not line[0].strip():
        proc.kill()
        raise RuntimeError(f"{what} did not start")
    return line[0].strip()


def start_server(delay_s: float) -> tuple[subprocess.Popen[str], str]:
    code = _SERVER.format(tests=str(ROOT / "tests"))
    proc = subprocess.Popen([sys.executable, "-c", code, str(delay_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    return proc, _read_line(proc, "fake OpenAI server")


def stop_server(proc: subprocess.Popen[str]) -> None:
    proc.stdin.close()  # type: ignore[union-attr]
    proc.wait(10)


def start_collector(db: Path) -> tuple[subprocess.Popen[str], str, str]:
    cmd = [sys.executable, "-m", "spanrl", "collector", "--db", str(db), "--grpc-port", "0", "--http-port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_clean_env())
    line = _read_line(proc, "spanrl collector")
    fields = dict(part.split("=", 1) for part in line.split()[3:])
    return proc, fields["grpc"], fields["http"]


def collector_count(http_endpoint: str, query: str) -> int:
    req = urllib.request.Request(
        f"{http_endpoint}/v1/sql", data=json.dumps({"sql": query}).encode(),
        headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        rows = json.loads(resp.read())["rows"]
    return int(next(iter(rows[0].values())))


def run_agent(mode: str, python: str, base_url: str, grpc: str, calls: int, warmup: int) -> dict[str, float]:
    env = _clean_env(BENCH_MODE=mode, OPENAI_BASE_URL=base_url + "/v1", OPENAI_API_KEY="sk-bench")
    cmd = [python, "-c", _AGENT, str(calls), str(warmup)]
    if mode.startswith("spanrl"):
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{grpc}", OTEL_PYTHON_DISTRO="spanrl",
                   OTEL_PYTHON_CONFIGURATOR="spanrl", SPANRL_ROLLOUT_ID="bench",
                   SPANRL_CAPTURE="lean" if mode == "spanrl-lean" else "full")
        cmd = [str(BIN / "opentelemetry-instrument"), *cmd]
    if mode.startswith("anchor"):
        env.update(AGENTOPS_API_KEY="dummy", LITELLM_LOCAL_MODEL_COST_MAP="True", AGENTOPS_LOG_LEVEL="ERROR")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=_AGENT_TIMEOUT_S)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} agent failed (rc {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][len("BENCH "):])


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS, help="timed calls per agent run")
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP_CALLS, help="untimed calls first")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="interleaved rounds of every mode")
    parser.add_argument("--call-ms", type=float, default=DEFAULT_CALL_MS, help="target plain call latency (ms)")
    parser.add_argument("--anchor-python", default=DEFAULT_ANCHOR_PYTHON,
                        help="python of a venv with agentlightning==0.3.0 ('' to skip the anchor)")
    parser.add_argument("--breakdown-calls", type=int, default=2000,
                        help="calls per stage of the breakdown's tight loop (reply in-process)")
    parser.add_argument("--breakdown-http-calls", type=int, default=500,
                        help="calls per stage of the breakdown between HTTP calls")
    parser.add_argument("--breakdown-only", action="store_true", help="only the breakdown (one agent process)")
    parser.add_argument("--baseline-pythonpath", metavar="DIR",
                        help="with --breakdown-only: also the breakdown of the spanrl unpacked in DIR, in turns")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as one JSON object to PATH "
                        "(and print it as the last line, prefixed BENCH_JSON)")
    args = parser.parse_args(argv)

    anchor = args.anchor_python and Path(args.anchor_python).exists()
    if args.anchor_python and not anchor:
        print(f"anchor venv {args.anchor_python} not found: create it with\n"
              f"  python3 -m venv /tmp/anchor-venv && /tmp/anchor-venv/bin/pip install agentlightning==0.3.0")
    modes = ["plain", "spanrl", "spanrl-lean"] + (["anchor-plain", "anchor"] if anchor else [])
    pythons = {"plain": str(BIN / "python"), "spanrl": str(BIN / "python"), "spanrl-lean": str(BIN / "python"),
               "anchor-plain": args.anchor_python, "anchor": args.anchor_python}

    with tempfile.TemporaryDirectory() as tmp:
        collector, grpc, http = start_collector(Path(tmp) / "bench.duckdb")
        server = None
        try:
            # Calibrate the server delay so a plain call takes about --call-ms.
            server, url = start_server(0.0)
            base = run_agent("plain", pythons["plain"], url, grpc, 100, 20)["median_s"]
            stop_server(server)
            delay_s = max(0.0, args.call_ms / 1000 - base)
            server, url = start_server(delay_s)
            if base > args.call_ms / 1000:
                print(f"note: the openai client alone takes {base * 1e3:.2f} ms per call here, more than "
                      f"--call-ms {args.call_ms}: percentages of the call are of the plain call as measured")
            print(f"server: bare call {base * 1e3:.2f} ms, delay set to {delay_s * 1e3:.2f} ms; "
                  f"{args.calls} calls x {args.rounds} rounds per mode; {os.cpu_count()} CPUs, "
                  f"load average {os.getloadavg()[0]:.1f}")

            def breakdown_now() -> dict[str, float]:
                return run_breakdown(grpc, url, args.breakdown_http_calls, args.breakdown_calls, args.rounds,
                                     _clean_env(SPANRL_ROLLOUT_ID="bench"))

            if args.breakdown_only and args.baseline_pythonpath:
                compare_breakdowns(args, grpc, url)
                return 0
            if args.breakdown_only:
                breakdown = breakdown_now()
                print_breakdown(breakdown, args.call_ms)
                write_json(args.json, {"call_ms": args.call_ms, "load_average": round(os.getloadavg()[0], 2),
                                       "breakdown": breakdown_json(breakdown, args.call_ms)})
                return 0
            results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            for r in range(args.rounds):
                for mode in modes:
                    results[mode].append(run_agent(mode, pythons[mode], url, grpc, args.calls, args.warmup))
                print(f"  round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{m} {results[m][-1]['median_s'] * 1e3:.3f} ms" for m in modes), flush=True)
            expected = args.rounds * (args.calls + args.warmup)
            time.sleep(1.0)
            stored = collector_count(http, "SELECT count(*) AS n FROM spans WHERE operation_name = 'chat'")
            rewards = collector_count(http, "SELECT count(*) AS n FROM spans WHERE reward_value IS NOT NULL")
            breakdown = breakdown_now()
        finally:
            if server is not None:
                stop_server(server)
            collector.terminate()
            collector.wait(30)

    report(args, modes, results, breakdown, {"chat": stored, "reward": rewards, "expected": expected})
    return 0


def compare_breakdowns(args: argparse.Namespace, grpc: str, url: str) -> None:
    """The breakdown of the spanrl in ``--baseline-pythonpath`` and of this one, a round each in turns (the
    first alternating). Each part is taken per round, then its median over rounds (a part of medians would
    mix rounds: the host moves every figure between rounds by more than the parts differ); the verdict's
    total is also compared round by round (the median of the paired ratios)."""
    env = _clean_env(SPANRL_ROLLOUT_ID="bench")
    versions = {"baseline": {**env, "PYTHONPATH": args.baseline_pythonpath}, "this": env}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in versions}
    for r in range(args.rounds):
        for name in (list(versions) if r % 2 == 0 else list(versions)[::-1]):
            runs[name].append(run_breakdown(grpc, url, args.breakdown_http_calls, args.breakdown_calls, 1,
                                            versions[name]))
            check_imported(runs[name][-1]["imported"], args.baseline_pythonpath if name == "baseline" else ROOT, name)
        print(f"  round {r + 1}/{args.rounds}: spanrl's own parts between HTTP calls " + ", ".join(
            f"{name} {spanrl_own(runs[name][-1]) * 1e6:.1f} us" for name in versions), flush=True)

    def per_round(name: str) -> list[tuple[str, list[float]]]:
        results = runs[name]
        rows = [(part, [dict(breakdown_parts(b))[part] for b in results]) for part, _ in breakdown_parts(results[0])]
        return rows + [("spanrl's own parts", [spanrl_own(b) for b in results]),
                       ("spanrl's own parts, tight loop", [spanrl_own(b, "loop") for b in results]),
                       ("lean capture", [lean_total(b) for b in results])]

    base, this = per_round("baseline"), per_round("this")
    print(f"\nCPU per call between HTTP calls, each part's median of its {args.rounds} per-round values "
          f"(load {os.getloadavg()[0]:.1f}):")
    print(f"  {'part':66s} {'baseline':>11s} {'this':>11s} {'ratio':>6s}")
    for (part, xs), (_, ys) in zip(base, this):
        x, y = statistics.median(xs), statistics.median(ys)
        ratio = f"{y / x:6.2f}" if x > 0 else f"{'-':>6s}"
        print(f"  {part:66s} {x * 1e6:8.1f} us {y * 1e6:8.1f} us {ratio}")
    own = dict(this)["spanrl's own parts"], dict(base)["spanrl's own parts"]
    paired = statistics.median(y / x for y, x in zip(*own) if x > 0)
    print(f"  spanrl's own parts, this / baseline round by round: median {paired:.2f} "
          f"({sum(y < x for y, x in zip(*own))} of {args.rounds} rounds lower)")
    write_json(args.json, {"call_ms": args.call_ms, "load_average": round(os.getloadavg()[0], 2),
                           "paired_ratio": round(paired, 3),
                           **{name: {part: [round(v * 1e6, 2) for v in values] for part, values in rows}
                              for name, rows in (("baseline_us", base), ("this_us", this))}})


def report(args: argparse.Namespace, modes: list[str], results: dict[str, list[dict[str, float]]],
           breakdown: dict[str, float], stored: dict[str, int]) -> None:
    """Print the figures of a full run, the verdict, and leave them for bench/report.py and ``--json``."""
    anchor = "anchor" in modes
    expected = stored["expected"]
    med = {m: statistics.median(x["median_s"] for x in results[m]) for m in modes}
    mean = {m: statistics.median(x["mean_s"] for x in results[m]) for m in modes}
    cpu = {m: statistics.median(x["cpu_s"] for x in results[m]) for m in modes}
    baseline = {"plain": "plain", "spanrl": "plain", "spanrl-lean": "plain", "anchor-plain": "anchor-plain",
                "anchor": "anchor-plain"}
    print()
    print(f"{'mode':14s} {'median/call us':>15s} {'overhead us':>12s} {'overhead %':>11s} "
          f"{'mean/call us':>13s} {'CPU/call us':>12s} {'CPU overhead us':>16s}")
    for m in modes:
        b = baseline[m]
        over = med[m] - med[b]
        print(f"{m:14s} {_us(med[m]):>15s} {_us(over):>12s} {100 * over / med[b]:10.1f}% "
              f"{_us(mean[m]):>13s} {_us(cpu[m]):>12s} {_us(cpu[m] - cpu[b]):>16s}")
    gc_s = {m: statistics.median(x["gc_s"] for x in results[m]) for m in modes}
    print(f"\ngarbage collection per call (in the CPU above): "
          + ", ".join(f"{m} {gc_s[m] * 1e6:.1f} us" for m in modes))
    print(f"spanrl: chat spans in the store {stored['chat']}/{expected} (lean records none), "
          f"reward spans {stored['reward']}/{2 * expected} (full and lean)")
    if anchor:
        print(f"anchor: spans in its store per run {statistics.median(x['stored'] for x in results['anchor']):.0f} "
              f"(expected {2 * (args.calls + args.warmup)} + session)")
        ours = med["spanrl"] - med["plain"]
        theirs = med["anchor"] - med["anchor-plain"]
        ratio = theirs / ours if ours > 0 else float("inf")
        print(
            f"overhead ratio anchor/spanrl: {ratio:.1f}x  (spanrl {ours * 1e6:.0f} us vs anchor {theirs * 1e6:.0f} us "
            "per call)"
        )
    plain_cpu = [x["cpu_s"] for x in results["plain"]]
    print_breakdown(breakdown, args.call_ms, cpu["spanrl"] - cpu["plain"], gc_s["spanrl"] - gc_s["plain"],
                    max(plain_cpu) - min(plain_cpu))
    print(f"load average at the end {os.getloadavg()[0]:.1f} (figures scale with it: compare within a run)")
    # The verdict needs both: the wall overhead (noisy on a busy machine, can even come out negative)
    # and the CPU of the instrumentation's parts between HTTP calls (steadier), each under 5% of the call.
    cpu_total = parts_total(breakdown)
    wall_ok = 0 <= (med["spanrl"] - med["plain"]) / med["plain"] < 0.05
    cpu_ok = cpu_total < 0.05 * args.call_ms / 1000
    print(f"goal: spanrl overhead < 5% of a {args.call_ms:.1f} ms call: {'MET' if wall_ok and cpu_ok else 'NOT MET'} "
          f"(wall {'ok' if wall_ok else 'not ok'}; CPU of the parts {cpu_total * 1e6:.0f} us, "
          f"{'ok' if cpu_ok else 'not ok'})")
    from _results import record  # bench/_results.py: for bench/report.py's README table

    record("tracer", {"call_ms": args.call_ms, "calls": args.calls, "rounds": args.rounds,
                      "median_s": med, "cpu_s": cpu, "parts_cpu_s": cpu_total,
                      "parts_cpu_tight_loop_s": parts_total(breakdown, "loop"), "goal_met": wall_ok and cpu_ok,
                      "stored": stored["chat"], "rewards": stored["reward"], "expected": expected})

    def mode_json(m: str) -> dict[str, float]:
        b = baseline[m]
        return {"median_call_us": round(med[m] * 1e6, 1), "overhead_us": round((med[m] - med[b]) * 1e6, 1),
                "overhead_pct_of_call": round(100 * (med[m] - med[b]) / med[b], 2),
                "cpu_per_call_us": round(cpu[m] * 1e6, 1), "cpu_overhead_us": round((cpu[m] - cpu[b]) * 1e6, 1)}

    write_json(args.json, {
        "call_ms": args.call_ms, "calls": args.calls, "rounds": args.rounds,
        "load_average": round(os.getloadavg()[0], 2),
        "modes": {m: mode_json(m) for m in modes}, "stored": stored,
        "anchor_over_spanrl": round(ratio, 2) if anchor else None, "breakdown": breakdown_json(breakdown, args.call_ms),
        "goal_met": wall_ok and cpu_ok,
    })


if __name__ == "__main__":
    sys.exit(main())
