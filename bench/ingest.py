"""Ingest benchmark: spans/s committed by `spanrl collector` over OTLP/gRPC, against the anchor.

    .venv/bin/python bench/ingest.py [--seconds 20] [--repeats 3] [--skip-anchor] [--baseline GIT_REF] [--json PATH]

Workloads, each a pre-encoded OTLP request of 512 spans (decoding on the client side is not timed):
  small         tool/agent spans, 6 short attributes each
  agent-array   realistic agent mix: 1 span in 5 is an LLM call with 300 prompt token ids, 60 completion
                ids, 60 logprobs (plain OTLP arrays) and 2 KB of message text; the rest are small
  agent-b64     the same spans, token arrays in spanrl's compact encoding (base64 little-endian int32 /
                float32, what spanrl's policy server writes)
For each workload: 1 and 4 sender processes (each keeps --inflight requests in flight, as an
OpenTelemetry Collector exporter with several consumers does) against a fresh collector subprocess;
a request counts only once acknowledged, i.e. committed to DuckDB on disk. Collector peak RSS is
VmHWM from /proc.

In the same run, the same spans go into the anchor, agentlightning==0.3.0's
InMemoryLightningStore.add_many_spans (512 per call, in memory, no durability), installed into its own
venv (--anchor-venv, ~780 MB, no torch). The ratio uses its time to build its Span objects from the
span data plus add_many_spans (spanrl's figure likewise starts from wire bytes); add_many_spans alone is
printed too.
Figures are medians of --repeats runs. --baseline REF also runs the collector of an older commit (exported
with `git archive`, put first on PYTHONPATH), one of its runs before each of this tree's, and prints the
ratios: before/after under the same machine load. --baseline python runs this tree's collector with
SPANRL_COLLECTOR_DECODER=python (its Python decoder, not the C fast path) as the baseline; --baseline
materialize-off runs it without the background thread that keeps finished rollouts decomposed
(SPANRL_COLLECTOR_MATERIALIZE_INTERVAL_S=0). --workloads agent-rollouts (not run by default): agent-array's
spans with every request a finished rollout of its own, so that thread has work as it would in training.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2

from spanrl import env
from spanrl import semconv as sc

SPANS_PER_REQUEST = 512
DISTINCT_REQUESTS = 8
LLM_EVERY_N_SPANS = 5
PROMPT_IDS, COMPLETION_IDS = 300, 60
MESSAGE_TEXT_BYTES = 2048
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
READY_PREFIX = "spanrl collector ready"
ANCHOR_PACKAGE = "agentlightning==0.3.0"
WORKLOADS = ("small", "agent-array", "agent-b64")
# agent-rollouts (not run by default): agent-array's spans as the policy server's (SERVER) under a
# spanrl.rollout root, and every request a rollout of its own (the senders rewrite the trace and rollout
# id placeholders), so the collector's background thread keeps each one decomposed as it finishes.
ROLLOUTS = "agent-rollouts"
Run = tuple[float, float, float, float, int]
"""One run's figures (run_spanrl): spans/s committed, spans per collector CPU-second, peak RSS (MiB),
senders' CPU us per span, DuckDB checkpoints in the timed window."""
_ID_HOLDER = b"0000000000"  # in b"trace-<10>" (16 bytes: the trace id) and "rollout-<10>"


# --- workloads ------------------------------------------------------------------------------------------
def _small_attrs(i: int, rng: random.Random) -> dict[str, Any]:
    return {
        sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL,
        sc.GEN_AI_TOOL_NAME: rng.choice(["calculator", "search", "sql"]),
        sc.GEN_AI_TOOL_CALL_ID: f"call_{rng.getrandbits(48):012x}",
        sc.GEN_AI_TOOL_CALL_ARGUMENTS: '{"a": 3, "b": 4}',
        "tool.latency_ms": rng.randint(1, 500),
        "step": i,
    }


def _llm_attrs(rng: random.Random, compact: bool) -> dict[str, Any]:
    prompt = [rng.randrange(32000) for _ in range(PROMPT_IDS)]
    completion = [rng.randrange(32000) for _ in range(COMPLETION_IDS)]
    logprobs = [-rng.random() * 3 for _ in range(COMPLETION_IDS)]
    text = ("The user asks for the total of the invoice lines; " * 64)[:MESSAGE_TEXT_BYTES]
    attrs: dict[str, Any] = {
        sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
        sc.GEN_AI_REQUEST_MODEL: "policy",
        sc.GEN_AI_RESPONSE_ID: f"chatcmpl-{rng.getrandbits(64):016x}",
        sc.GEN_AI_USAGE_INPUT_TOKENS: PROMPT_IDS,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: COMPLETION_IDS,
        sc.GEN_AI_INPUT_MESSAGES: json.dumps([{"role": "user", "parts": [{"type": "text", "content": text}]}]),
        sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": "<call> add 3 4 </call>"}]}]
        ),
        sc.POLICY_VERSION: 3,
    }
    if compact:
        attrs[sc.LLM_PROMPT_TOKEN_IDS] = base64.b64encode(np.asarray(prompt, "<i4").tobytes()).decode()
        attrs[sc.LLM_COMPLETION_TOKEN_IDS] = base64.b64encode(np.asarray(completion, "<i4").tobytes()).decode()
        attrs[sc.LLM_LOGPROBS] = base64.b64encode(np.asarray(logprobs, "<f4").tobytes()).decode()
    else:
        attrs[sc.LLM_PROMPT_TOKEN_IDS] = prompt
        attrs[sc.LLM_COMPLETION_TOKEN_IDS] = completion
        attrs[sc.LLM_LOGPROBS] = logprobs
    return attrs


def make_spans(workload: str, seed: int) -> list[dict[str, Any]]:
    """512 span descriptions (plain Python), the single source for both stores."""
    rng = random.Random(seed)
    trace_id = rng.getrandbits(128).to_bytes(16, "big") if workload != ROLLOUTS else b"trace-" + _ID_HOLDER
    root = rng.getrandbits(64).to_bytes(8, "big")
    spans = []
    t0 = 1_790_000_000_000_000_000 + seed * 10**9
    for i in range(SPANS_PER_REQUEST):
        llm = workload != "small" and i % LLM_EVERY_N_SPANS == 1
        attrs = _llm_attrs(rng, workload == "agent-b64") if llm else _small_attrs(i, rng)
        span_id = root if i == 0 else rng.getrandbits(64).to_bytes(8, "big")
        spans.append({
            "trace_id": trace_id, "span_id": span_id, "parent": None if i == 0 else root,
            "name": "chat policy" if llm else f"execute_tool {attrs.get(sc.GEN_AI_TOOL_NAME)}",
            "kind": (2 if workload == ROLLOUTS else 3) if llm else 1, "start": t0 + i * 1000,
            "end": t0 + i * 1000 + 900, "attributes": attrs,
        })
    if workload == ROLLOUTS:
        spans[0]["name"] = sc.ROLLOUT_SPAN_NAME  # the root: the rollout has finished once it is stored
    return spans


def _any(v: Any) -> common_pb2.AnyValue:
    if isinstance(v, bool):
        return common_pb2.AnyValue(bool_value=v)
    if isinstance(v, int):
        return common_pb2.AnyValue(int_value=v)
    if isinstance(v, float):
        return common_pb2.AnyValue(double_value=v)
    if isinstance(v, list):
        return common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[_any(x) for x in v]))
    return common_pb2.AnyValue(string_value=v)


def encode_otlp(spans: list[dict[str, Any]], rollout_id: str) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in {sc.SERVICE_NAME: "bench-agent", sc.ROLLOUT_ID: rollout_id, sc.TASK_ID: "task-1"}.items():
        rs.resource.attributes.add(key=k, value=_any(v))
    ss = rs.scope_spans.add()
    ss.scope.name = "bench"
    for s in spans:
        p = ss.spans.add(trace_id=s["trace_id"], span_id=s["span_id"], parent_span_id=s["parent"] or b"",
                         name=s["name"], kind=s["kind"], start_time_unix_nano=s["start"], end_time_unix_nano=s["end"])
        for k, v in s["attributes"].items():
            p.attributes.add(key=k, value=_any(v))
    return req.SerializeToString()


# --- spanrl: collector subprocess + sender processes --------------------------------------------------
def _sender(endpoint: str, bodies: list[bytes], inflight: int, deadline: float, out: Any) -> None:
    import grpc

    channel = grpc.insecure_channel(endpoint, options=[("grpc.max_send_message_length", 64 << 20)])
    call = channel.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
    counts = [0] * inflight

    def loop(k: int) -> None:
        j = k
        while time.monotonic() < deadline:
            call(bodies[j % len(bodies)], timeout=60)
            counts[k] += 1
            j += inflight

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(inflight)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    channel.close()
    out.put(sum(counts))


def _unique(body: bytes, sender: int, k: int, j: int) -> bytes:
    """An agent-rollouts body as a rollout of its own: its trace and rollout id placeholders rewritten."""
    new = f"{sender % 100:02d}{k % 100:02d}{j % 10**6:06d}".encode()
    return body.replace(b"trace-" + _ID_HOLDER, b"trace-" + new).replace(b"rollout-" + _ID_HOLDER, b"rollout-" + new)


def _timed_sender(endpoint: str, bodies: list[bytes], inflight: int, seconds: float, out: Any, go: Any,
                  unique: bool = False) -> None:
    """A sender process: connect, report "ready", wait for ``go``, send for ``seconds``, report the count
    of acknowledged requests (-1 if any request failed) and its own CPU seconds while sending.
    ``unique``: every request a rollout of its own (agent-rollouts)."""
    import grpc

    channel = grpc.insecure_channel(endpoint, options=[("grpc.max_send_message_length", 64 << 20)])
    grpc.channel_ready_future(channel).result(timeout=60)
    call = channel.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
    counts = [0] * inflight
    failed: list[BaseException] = []
    out.put("ready")
    go.wait()
    cpu0 = time.process_time()
    deadline = time.monotonic() + seconds

    def loop(k: int) -> None:
        j = k
        try:
            while time.monotonic() < deadline:
                body = bodies[j % len(bodies)]
                call(_unique(body, os.getpid(), k, j) if unique else body, timeout=120)
                counts[k] += 1
                j += inflight
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            failed.append(exc)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(inflight)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    channel.close()
    if failed:
        print(f"sender failed: {failed[0]!r}", file=sys.stderr, flush=True)
    out.put((-1 if failed else sum(counts), time.process_time() - cpu0))


def _start_collector(db: Path, baseline_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, str]:
    proc_env = dict(os.environ, **baseline_env) if baseline_env else None
    # Not from the checkout's root: `-m` puts the working directory first on sys.path, and its spanrl/
    # folder would then shadow the --baseline export (the "baseline" ran this tree's code).
    proc = subprocess.Popen([sys.executable, "-m", "spanrl", "--log-level", "WARNING", "collector", "--db", str(db),
                             "--grpc-port", "0", "--http-port", "0"],
                            stdout=subprocess.PIPE, text=True, env=proc_env, cwd=db.parent)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line.startswith(READY_PREFIX):
        proc.kill()
        raise RuntimeError(f"collector did not start: {line!r}")
    fields = dict(p.split("=", 1) for p in line.split()[3:])
    return proc, fields["grpc"], fields["http"]


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _count(http: str) -> int:
    req = urllib.request.Request(f"{http}/v1/sql", data=json.dumps({"sql": "SELECT count(*) AS n FROM spans"}).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return int(json.loads(resp.read())["rows"][0]["n"])


class _CheckpointCount(threading.Thread):
    """Counts DuckDB's automatic checkpoints while it runs: each one empties the write-ahead log, so the
    WAL file's size drops (sampled every 50 ms from this process; the collector is not asked)."""

    def __init__(self, wal: Path) -> None:
        super().__init__(daemon=True)
        self.wal, self.count, self._done = wal, 0, threading.Event()

    def run(self) -> None:
        last = 0
        while not self._done.wait(0.05):
            try:
                size = self.wal.stat().st_size
            except FileNotFoundError:  # not written yet, or removed by the checkpoint
                size = 0
            self.count += size < last
            last = size

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.count


def run_spanrl(bodies: list[bytes], senders: int, inflight: int, seconds: float, tmp: Path,
               baseline_env: dict[str, str] | None = None) -> Run:
    """One run: spans/s committed, spans per collector CPU-second, collector peak RSS (MiB), the senders'
    CPU microseconds per span, DuckDB checkpoints during the timed window (their cost is in the figure
    only when there is one: a run shorter than one WAL threshold's worth of spans leaves it out)."""
    db = tmp / f"bench-{time.monotonic_ns()}.duckdb"
    proc, grpc_ep, http_ep = _start_collector(db, baseline_env)
    try:
        # spawn, not fork: a child forked after this process used gRPC can hang in gRPC.
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        _sender(grpc_ep, bodies[:1], 1, time.monotonic() + 0.3, q)  # warm-up, not timed
        warm = q.get(timeout=120) * SPANS_PER_REQUEST
        go = ctx.Event()
        unique = b"rollout-" + _ID_HOLDER in bodies[0]
        procs = [ctx.Process(target=_timed_sender, args=(grpc_ep, bodies[k % len(bodies):] + bodies[: k % len(bodies)],
                                                         inflight, seconds, q, go, unique))
                 for k in range(senders)]
        for p in procs:
            p.start()
        ready = [q.get(timeout=120) for _ in procs]  # each sender reports "ready" once imported and connected
        assert all(r == "ready" for r in ready)
        checkpoints = _CheckpointCount(Path(f"{db}.wal"))
        checkpoints.start()
        cpu0 = _cpu_s(proc.pid)
        start = time.monotonic()
        go.set()
        reports = [q.get(timeout=seconds + 300) for _ in procs]
        elapsed = time.monotonic() - start
        n_checkpoints = checkpoints.stop()
        counts = [r[0] for r in reports]
        sender_cpu = sum(r[1] for r in reports)
        if any(c < 0 for c in counts):
            raise RuntimeError("a sender's request failed; see its message above")
        requests = sum(counts)
        cpu = _cpu_s(proc.pid) - cpu0
        for p in procs:
            p.join(60)
        spans = requests * SPANS_PER_REQUEST
        stored = _count(http_ep)
        if stored != spans + warm:
            raise RuntimeError(f"store holds {stored} spans, {spans + warm} were acknowledged")
        rss = _peak_rss_mib(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        for suffix in ("", ".wal"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    return spans / elapsed, spans / max(cpu, 1e-9), rss, sender_cpu / max(spans, 1) * 1e6, n_checkpoints


def export_baseline(ref: str, tmp: Path) -> dict[str, str]:
    """The environment that runs the baseline's collector: ``python``, this tree with its Python decoder
    only; else `git archive` of ``ref`` as an importable `spanrl` (pyproject's folder mapping, by symlinks)
    on PYTHONPATH, where it wins over the editable install. Its C extension is not in git: when the ref's
    C sources equal this tree's, this tree's build is copied in (a ref before the extension, or with
    other sources, runs its Python decoder; the start log says which)."""
    if ref == "python":
        return {env.SPANRL_COLLECTOR_DECODER: "python"}
    if ref == "materialize-off":
        return {env.SPANRL_COLLECTOR_MATERIALIZE_INTERVAL_S: "0"}
    root = Path(__file__).resolve().parent.parent
    src, pkg = tmp / "baseline-src", tmp / "baseline-pkg" / "spanrl"
    src.mkdir()
    pkg.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(root), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    same_c = subprocess.run(["git", "-C", str(root), "diff", "--quiet", ref,
                             "--", "collector/*.c", "collector/*.h"]).returncode == 0
    for built in (root / "collector").glob("_wire*.so") if same_c else ():
        shutil.copy2(built, src / "collector" / built.name)
    for f in (src / "spanrl").iterdir():
        (pkg / f.name).symlink_to(f)
    for sub in ("instrumentation", "collector", "store", "algorithms", "trainer", "serving", "ui"):
        if (src / sub).is_dir():
            (pkg / sub).symlink_to(src / sub)
    return {"PYTHONPATH": str(pkg.parent)}


# --- anchor ---------------------------------------------------------------------------------------------
ANCHOR_SCRIPT = r"""
import asyncio, json, statistics, sys, time
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.types import Span, TraceStatus, OtelResource, SpanContext

spec = json.load(open(sys.argv[1]))
repeats = int(sys.argv[2])

async def main():
    store = InMemoryLightningStore()
    attempted = await store.start_rollout(input={"task": 1})
    rid, aid = attempted.rollout_id, attempted.attempt.attempt_id
    seq = 0
    def build(spans):
        nonlocal seq
        out = []
        for s in spans:
            seq += 1
            out.append(Span(rollout_id=rid, attempt_id=aid, sequence_id=seq, trace_id=s["trace_id"],
                            span_id=s["span_id"], parent_id=s["parent"], name=s["name"],
                            status=TraceStatus(status_code="UNSET"), attributes=s["attributes"], events=[], links=[],
                            start_time=s["start"] / 1e9, end_time=s["end"] / 1e9,
                            context=SpanContext(trace_id=s["trace_id"], span_id=s["span_id"], is_remote=False,
                                                trace_state={}),
                            parent=None,
                            resource=OtelResource(attributes={"service.name": "bench-agent"}, schema_url="")))
        return out
    rates, cpu_rates, full_rates, full_cpu = [], [], [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        batches = [build(spans) for spans in spec]
        bt, bc = time.perf_counter() - t, time.process_time() - c
        n = sum(len(b) for b in batches)
        t, c = time.perf_counter(), time.process_time()
        for b in batches:
            await store.add_many_spans(b)
        at, ac = time.perf_counter() - t, time.process_time() - c
        rates.append(n / at)
        cpu_rates.append(n / ac)
        full_rates.append(n / (at + bt))
        full_cpu.append(n / (ac + bc))
    med = statistics.median
    print(json.dumps({"add": med(rates), "add_cpu": med(cpu_rates), "build_add": med(full_rates),
                      "build_add_cpu": med(full_cpu)}))

asyncio.run(main())
"""


def ensure_anchor(venv: Path) -> Path:
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import agentlightning, importlib.metadata as m; print(m.version('agentlightning'))"]
    installed = python.exists() and subprocess.run(probe, capture_output=True, text=True).stdout.strip()
    if installed == ANCHOR_PACKAGE.split("==")[1]:
        return python
    print(f"installing {ANCHOR_PACKAGE} into {venv} (~780 MB, once)...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", ANCHOR_PACKAGE], check=True)
    return python


def run_anchor(python: Path, spans_sets: list[list[dict[str, Any]]], repeats: int, tmp: Path) -> dict[str, float]:
    """The anchor's median spans/s and spans per CPU-second: add_many_spans alone ("add", "add_cpu") and
    with building its Span objects from the plain span data ("build_add", "build_add_cpu")."""
    def plain(s: dict[str, Any]) -> dict[str, Any]:
        return {**s, "trace_id": s["trace_id"].hex(), "span_id": s["span_id"].hex(),
                "parent": s["parent"].hex() if s["parent"] else None}

    spec = tmp / "anchor-spans.json"
    spec.write_text(json.dumps([[plain(s) for s in spans] for spans in spans_sets]))
    script = tmp / "anchor_bench.py"
    script.write_text(ANCHOR_SCRIPT)
    out = subprocess.run([str(python), str(script), str(spec), str(repeats)], capture_output=True, text=True,
                         check=True, timeout=1800)
    return {k: float(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


# --- attribute layout (why attributes are kept as JSON) -------------------------------------------------
def bench_layouts(rows: int, tmp: Path) -> None:
    """Ingest and query cost of three layouts for the attributes of agent spans, on disk."""
    import duckdb
    import orjson
    import pyarrow as pa

    from spanrl.collector.encoding import decode_protobuf_request, encode_request

    one = encode_request(decode_protobuf_request(encode_otlp(make_spans("agent-b64", 0), "r"))).table
    attrs = pa.concat_tables([one] * (rows // one.num_rows)).column("attributes").combine_chunks()
    dicts = [orjson.loads(a) for a in attrs.to_pylist()]
    t = time.perf_counter()
    as_map = pa.array([{k: v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in d.items()} for d in dicts],
                      pa.map_(pa.string(), pa.string()))
    map_build_s = time.perf_counter() - t
    layouts = {"JSON": ("JSON", pa.table({"attributes": attrs})),
               "MAP(VARCHAR, VARCHAR)": ("MAP(VARCHAR, VARCHAR)", pa.table({"attributes": as_map}))}
    queries = {
        "JSON": "SELECT attributes ->> '$.\"gen_ai.request.model\"' AS m, count(*) FROM t GROUP BY m",
        "MAP(VARCHAR, VARCHAR)": "SELECT attributes['gen_ai.request.model'] AS m, count(*) FROM t GROUP BY m",
    }
    print(f"\nattribute layouts, {attrs.__len__():,} agent-span rows on disk (median of 3):")
    for name, (ddl, table) in layouts.items():
        ingest, query = [], []
        for k in range(3):
            db = tmp / f"layout-{k}.duckdb"
            con = duckdb.connect(str(db))
            con.execute(f"CREATE TABLE t (attributes {ddl})")
            con.register("src", table)
            t = time.perf_counter()
            con.execute("INSERT INTO t SELECT * FROM src")
            ingest.append(time.perf_counter() - t)
            t = time.perf_counter()
            con.execute(queries[name]).fetchall()
            query.append(time.perf_counter() - t)
            con.close()
            db.unlink()
        extra = f" (+ {map_build_s:.2f} s building the map in Python)" if name.startswith("MAP") else ""
        print(
            f"  {name:22s} insert {statistics.median(ingest):.2f} s{extra}, extract-and-group "
            f"{statistics.median(query):.3f} s"
        )
    print("  MAP stores arrays and objects as JSON text anyway (values are VARCHAR), and its keys are per-row data.")


# --- main -----------------------------------------------------------------------------------------------
def measure(workload: str, bodies: list[bytes], n: int, args: argparse.Namespace, tmp: Path,
            baseline: dict[str, str] | None) -> tuple[list[Run], list[Run]]:
    """--repeats runs of this tree's collector and, with --baseline, of the baseline's (each just before
    one of ours)."""
    runs, base_runs = [], []
    for _ in range(args.repeats):  # interleaved, so both versions see the same machine load
        if baseline is not None:
            base_runs.append(run_spanrl(bodies, n, args.inflight, args.seconds, tmp, baseline))
        runs.append(run_spanrl(bodies, n, args.inflight, args.seconds, tmp))
    if base_runs:
        b_rate, b_cpu = (statistics.median(r[k] for r in base_runs) for k in (0, 1))
        rate, cpu = (statistics.median(r[k] for r in runs) for k in (0, 1))
        print(f"  {workload:12s} {n} sender(s): baseline {args.baseline}: {b_rate:>9,.0f} spans/s (runs: "
              f"{', '.join(f'{r[0]:,.0f}' for r in base_runs)}), {b_cpu:,.0f} per collector CPU-second "
              f"({1e6 / b_cpu:.1f} us per span); "
              f"this tree x{rate / b_rate:.2f} spans/s, x{cpu / b_cpu:.2f} per CPU-second "
              f"({1e6 / cpu:.1f} us per span)",
              flush=True)
    return runs, base_runs


def _figures(runs: list[Run]) -> dict[str, Any]:
    cpu = statistics.median(r[1] for r in runs)
    return {"spans_per_s": statistics.median(r[0] for r in runs), "runs_spans_per_s": [r[0] for r in runs],
            "collector_us_cpu_per_span": 1e6 / cpu, "projected_2_cores_spans_per_s": 2 * cpu,
            "peak_rss_mib": max(r[2] for r in runs), "senders_us_cpu_per_span": statistics.median(r[3] for r in runs),
            "runs_checkpoints": [r[4] for r in runs]}


def _json_report(results: dict[str, dict[str, Any]], senders: list[int], anchor_ref: dict[str, str],
                 args: argparse.Namespace, load0: tuple[float, float, float]) -> dict[str, Any]:
    """The --json object: per workload and sender count this tree's figures, the baseline's and the
    before/after ratios (with --baseline), the anchor's and the ratios to it; machine load."""
    out: dict[str, Any] = {"spans_per_request": SPANS_PER_REQUEST, "inflight_per_sender": args.inflight,
                           "seconds": args.seconds,
                           "repeats": args.repeats, "cores": os.cpu_count(), "load_1min_start": load0[0],
                           "load_1min_end": os.getloadavg()[0], "baseline": args.baseline, "workloads": {}}
    for workload, row in results.items():
        ref = results.get(anchor_ref[workload], {})
        entry: dict[str, Any] = {"request_kib": row["request_kib"], "anchor_spans_per_s": ref.get("anchor"),
                                 "anchor_spans_per_cpu_s": ref.get("anchor_cpu"), "senders": {}}
        for n in senders:
            fig = _figures(row[f"runs_{n}"])
            if ref.get("anchor"):
                fig["x_anchor_spans_per_s"] = fig["spans_per_s"] / ref["anchor"]
                fig["x_anchor_cpu"] = 1e6 / fig["collector_us_cpu_per_span"] / ref["anchor_cpu"]
            if row[f"base_runs_{n}"]:
                base = _figures(row[f"base_runs_{n}"])
                fig["baseline"] = base
                fig["x_baseline_spans_per_s"] = fig["spans_per_s"] / base["spans_per_s"]
                fig["x_baseline_cpu"] = base["collector_us_cpu_per_span"] / fig["collector_us_cpu_per_span"]
            entry["senders"][str(n)] = fig
        out["workloads"][workload] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="sending time per run; 20 s holds DuckDB's automatic checkpoint at 2 cores' rates (a run "
                             "shorter than one WAL threshold's worth of spans leaves its cost out; each run prints its "
                             "count)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median reported)")
    parser.add_argument("--inflight", type=int, default=4, help="requests in flight per sender process")
    parser.add_argument("--senders", default="1,4", help="sender process counts")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--anchor-venv", default="/tmp/anchor-venv")
    parser.add_argument("--skip-anchor", action="store_true")
    parser.add_argument("--baseline", metavar="GIT_REF",
                        help="also run the collector of this commit (or 'python': this tree without the C fast "
                             "path), interleaved run by run, and print the ratio")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as one JSON object to PATH")
    parser.add_argument("--layouts", type=int, default=0, metavar="ROWS",
                        help="only compare attribute layouts (JSON vs MAP) on ROWS agent spans, then exit")
    args = parser.parse_args()
    if args.layouts:
        with tempfile.TemporaryDirectory(prefix="spanrl-bench-") as tmpdir:
            bench_layouts(args.layouts, Path(tmpdir))
        return
    workloads = args.workloads.split(",")
    senders = [int(s) for s in args.senders.split(",")]
    anchor_python = None if args.skip_anchor else ensure_anchor(Path(args.anchor_venv))

    load0 = os.getloadavg()
    print(
        f"cores: {os.cpu_count()}, load {load0[0]:.1f}, {SPANS_PER_REQUEST} spans/request, {args.inflight} in flight "
        "per sender, "
          f"{args.seconds:.0f} s per run, median of {args.repeats}")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="spanrl-bench-") as tmpdir:
        tmp = Path(tmpdir)
        baseline = export_baseline(args.baseline, tmp) if args.baseline else None
        for workload in workloads:
            spans_sets = [make_spans(workload, seed) for seed in range(DISTINCT_REQUESTS)]
            rid = (lambda k: f"rollout-{_ID_HOLDER.decode()}") if workload == ROLLOUTS else (lambda k: f"rollout-{k}")
            bodies = [encode_otlp(s, rid(k)) for k, s in enumerate(spans_sets)]
            row: dict[str, Any] = {"request_kib": len(bodies[0]) / 1024}
            for n in senders:
                runs, base_runs = measure(workload, bodies, n, args, tmp, baseline)
                row[f"runs_{n}"], row[f"base_runs_{n}"] = runs, base_runs
                row[f"spanrl_{n}"] = statistics.median(r[0] for r in runs)
                row[f"cpu_{n}"] = statistics.median(r[1] for r in runs)
                row[f"rss_{n}"] = max(r[2] for r in runs)
                row[f"checkpoints_{n}"] = [r[4] for r in runs]
                sender_us = statistics.median(r[3] for r in runs)
                print(f"  {workload:12s} {n} sender(s): {row[f'spanrl_{n}']:>9,.0f} spans/s  (runs: "
                      f"{', '.join(f'{r[0]:,.0f}' for r in runs)}); {row[f'cpu_{n}']:,.0f} spans per collector "
                      f"CPU-second; peak RSS {row[f'rss_{n}']:.0f} MiB; DuckDB checkpoints in the runs: "
                      f"{', '.join(map(str, row[f'checkpoints_{n}']))}", flush=True)
                print(f"  {'':12s} collector {1e6 / row[f'cpu_{n}']:.1f} us CPU per span (all its threads) = "
                      f"{2 * row[f'cpu_{n}']:,.0f} spans/s projected on 2 cores; senders {sender_us:.1f} us CPU per "
                      "span",
                      flush=True)
            if anchor_python is not None and workload != "agent-b64":  # the anchor has no compact encoding
                a = run_anchor(anchor_python, spans_sets, args.repeats, tmp)
                row["anchor"], row["anchor_cpu"] = a["build_add"], a["build_add_cpu"]
                print(f"  {workload:12s} anchor: build Span + add_many_spans {a['build_add']:>9,.0f} spans/s "
                      f"({a['build_add_cpu']:,.0f} per CPU-second); add_many_spans alone {a['add']:,.0f} spans/s "
                      f"({a['add_cpu']:,.0f} per CPU-second)", flush=True)
            results[workload] = row

    anchor_ref = {"small": "small", "agent-array": "agent-array", "agent-b64": "agent-array", ROLLOUTS: "agent-array"}
    if args.json:
        Path(args.json).write_text(json.dumps(_json_report(results, senders, anchor_ref, args, load0), indent=1) + "\n")
    print()
    header = f"{'workload':12s} {'req KiB':>8s} " + " ".join(f"{f'spanrl {n}s':>12s}" for n in senders) + \
        f" {'peak RSS':>9s} {'anchor':>10s} " + " ".join(f"{f'x anchor {n}s':>12s}" for n in senders)
    header += f" {'CPU-s x anchor':>15s}"
    print(header)
    for workload, row in results.items():
        anchor = results.get(anchor_ref[workload], {}).get("anchor")
        anchor_cpu = results.get(anchor_ref[workload], {}).get("anchor_cpu")
        cells = [f"{workload:12s}", f"{row['request_kib']:8.0f}"]
        cells += [f"{row[f'spanrl_{n}']:12,.0f}" for n in senders]
        cells.append(f"{max(row[f'rss_{n}'] for n in senders):8.0f}M")
        cells.append(f"{anchor:10,.0f}" if anchor else f"{'-':>10s}")
        cells += [f"{row[f'spanrl_{n}'] / anchor:11.1f}x" if anchor else f"{'-':>12s}" for n in senders]
        best_cpu = max(row[f"cpu_{n}"] for n in senders)
        cells.append(f"{best_cpu / anchor_cpu:14.1f}x" if anchor_cpu else f"{'-':>15s}")
        print(" ".join(cells))
    print("\nspanrl: spans/s acknowledged after commit to DuckDB on disk, OTLP/gRPC, collector in its own process.")
    print("CPU-s x anchor: spans per CPU-second of the collector process (all its threads) over the anchor's spans "
          "per CPU-second; steadier than wall time on a shared machine.")
    print("anchor: agentlightning 0.3.0, building its Span objects from the same span data, then "
          "InMemoryLightningStore.add_many_spans (512 per call), in process, in memory, no durability; "
          "agent-b64 compares against the anchor's agent-array figure (it has no compact encoding).")
    from _results import record  # bench/_results.py: for bench/report.py's README table

    record("ingest", {"seconds": args.seconds, "repeats": args.repeats, "inflight": args.inflight,
                      "senders": senders, "workloads": results})


if __name__ == "__main__":
    main()
