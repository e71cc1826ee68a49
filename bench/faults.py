"""Fault suite: the collector and the policy server under malformed input, SIGKILL, overload and abuse.

    .venv/bin/python bench/faults.py [--only malformed,sigkill,overload,sql,policy,rewards,abuse,bounds] [--quick]

Every server runs as its own subprocess on 127.0.0.1 (`spanrl collector`, `spanrl serve`); figures go to
docs/measurements.md, "Reliability (faults and abuse)". Sections:
  malformed  >= 1,000 bad OTLP inputs (protobuf over HTTP and gRPC, JSON): random bytes, truncations, bit
             flips, bad ids, timestamps >= 2^63, bad token arrays, NaN, deep nesting, wrong types. Every
             answer must be 200 (maybe partial), 400 / INVALID_ARGUMENT or 413, never retryable or 5xx,
             and the store must hold exactly the spans acknowledged as accepted.
  sigkill    8 concurrent gRPC senders, the collector SIGKILLed 4 times mid-stream and restarted on the
             same file: every acknowledged span id must be in the store.
  overload   6 clients sending ~34 MiB requests as fast as they can, over HTTP then gRPC: peak RSS (VmHWM) under
             max_inflight_bytes + max_queue_bytes + duckdb_memory_limit + 500 MiB, and every refusal must
             be a 503 with Retry-After.
  sql        file reads, writes, SET, ATTACH, EXPLAIN ANALYZE of writes: all 400, nothing written; 6 runaway
             cross joins interrupted at the time limit while OTLP export latency is measured.
  policy     >= 200 bad requests to the policy server (tiny model) beside 64 concurrent valid ones: every bad
             one a 4xx OpenAI-style error, every valid one a 200, /health latency meanwhile.
  rewards    unusable rewards (NaN, +-inf, 1e200, 1e308, -1e7, the strings "nan" / "1e200") as a span attribute,
             a spanrl.reward event and a gen_ai.evaluation.result event, over gRPC and HTTP, with the C and the
             Python decoder: each such span rejected alone with its reason, the rest stored, no unusable
             reward in any view; and a verdict stamped 2^62 ns sent before an honest one loses to it.
  abuse      who may do what (bench/_abuse.py): cross-site and DNS-rebinding requests, tokens outside their
             scope, forged token ids and rollout joins, weight reloads without the admin token or outside the
             checkpoint root.
  bounds     fail closed and bounded (bench/_bounds.py): scopes no token grants, SQL row caps and a writing CTE,
             idle gRPC calls beside an export, prune past the ns range, /health on a full disk.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from _abuse import bench_abuse
from _bounds import bench_bounds
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                    ExportTraceServiceResponse)
from opentelemetry.proto.common.v1 import common_pb2

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_MiB = 1024 * 1024


# --- helpers ----------------------------------------------------------------------------------------------
def _request(n: int, *, payload: int = 64, rollout: str = "r") -> tuple[ExportTraceServiceRequest, list[str]]:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="spanrl.rollout.id", value=common_pb2.AnyValue(string_value=rollout))
    ss = rs.scope_spans.add()
    trace = os.urandom(16)
    ids = []
    for i in range(n):
        sid = os.urandom(8)
        span = ss.spans.add(trace_id=trace, span_id=sid, name="s", start_time_unix_nano=1000 + i,
                            end_time_unix_nano=2000 + i)
        span.attributes.add(key="payload", value=common_pb2.AnyValue(string_value=os.urandom(payload // 2).hex()))
        ids.append(sid.hex())
    return req, ids


def _post(url: str, body: bytes, ctype: str, timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers={"content-type": ctype}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class Collector:
    """`spanrl collector` subprocess on free ports; kill / restart on the same file and ports."""

    def __init__(self, db: Path, *extra: str) -> None:
        self.db, self.extra, self.ports = db, extra, ("0", "0")
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> "Collector":
        cmd = [sys.executable, "-m", "spanrl", "collector", "--db", str(self.db), "--grpc-port", self.ports[0],
               "--http-port", self.ports[1], *self.extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("spanrl collector ready"):
            raise RuntimeError(f"collector did not start: {line!r}")
        fields = dict(p.split("=", 1) for p in line.split()[3:])
        self.grpc, self.http = fields["grpc"], fields["http"]
        self.ports = (self.grpc.rsplit(":", 1)[1], self.http.rsplit(":", 1)[1])
        return self

    def sql(self, query: str) -> list[dict[str, Any]]:
        status, _, body = _post(f"{self.http}/v1/sql", json.dumps({"sql": query}).encode(), "application/json", 300)
        if status != 200:
            raise RuntimeError(body[:300])
        return json.loads(body)["rows"]

    def count(self, ids: list[str]) -> int:
        n = 0
        for i in range(0, len(ids), 5000):
            chunk = ", ".join(f"'{x}'" for x in ids[i : i + 5000])
            n += self.sql(f"SELECT count(DISTINCT span_id) AS n FROM spans WHERE span_id IN ({chunk})")[0]["n"]
        return n

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():  # type: ignore[union-attr]
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        self.proc.wait(30)  # type: ignore[union-attr]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        return self.proc.wait(60)  # type: ignore[union-attr]


# --- malformed OTLP ---------------------------------------------------------------------------------------
def _malformed_protobuf(rng: random.Random, n: int) -> list[tuple[str, bytes]]:
    cases: list[tuple[str, bytes]] = []
    base = _request(20)[0].SerializeToString()
    for i in range(n):
        kind = i % 6
        if kind == 0:
            cases.append(("random", rng.randbytes(rng.randint(1, 4000))))
        elif kind == 1:
            cases.append(("truncated", base[: rng.randint(1, len(base) - 1)]))
        elif kind == 2:
            flipped = bytearray(base)
            for _ in range(rng.randint(1, 8)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            cases.append(("bitflip", bytes(flipped)))
        else:
            req, _ = _request(10)
            spans = req.resource_spans[0].scope_spans[0].spans
            victim = spans[rng.randrange(len(spans))]
            if kind == 3:
                victim.span_id = rng.choice([b"", b"\0" * 8, os.urandom(7), os.urandom(9)])
            elif kind == 4:
                victim.start_time_unix_nano = rng.randint(2**63, 2**64 - 1)
            else:
                bad = rng.choice([common_pb2.AnyValue(string_value="!!notbase64"),
                                  common_pb2.AnyValue(bytes_value=b"abc"),
                                  common_pb2.AnyValue(
                                      array_value=common_pb2.ArrayValue(values=[common_pb2.AnyValue(string_value="x")])
                                  ),
                                  common_pb2.AnyValue(
                                      array_value=common_pb2.ArrayValue(values=[common_pb2.AnyValue(int_value=2**40)])
                                  )])
                victim.attributes.add(key="spanrl.llm.prompt_token_ids", value=bad)
            cases.append((("bad-id", "time>=2^63", "bad-tokens")[kind - 3], req.SerializeToString()))
    return cases


def _malformed_json(rng: random.Random, n: int) -> list[tuple[str, bytes]]:
    def span(**over: Any) -> dict[str, Any]:
        return {"traceId": os.urandom(16).hex(), "spanId": os.urandom(8).hex(), "name": "j", "startTimeUnixNano": "1",
                "endTimeUnixNano": "2", **over}

    makers = [
        lambda: rng.randbytes(rng.randint(1, 500)),
        lambda: b"[" * 100_000 + b"]" * 100_000,
        lambda: b'{"resourceSpans": NaN}',
        lambda: json.dumps({"resourceSpans": "nope"}).encode(),
        lambda: json.dumps(
            {"resourceSpans": [{"scopeSpans": [{"spans": [span(traceId="zz" * 16), span()]}]}]}
        ).encode(),
        lambda: json.dumps(
            {"resourceSpans": [{"scopeSpans": [{"spans": [span(startTimeUnixNano=str(2**64 - 1)), span()]}]}]}
        ).encode(),
        lambda: json.dumps(
            {"resourceSpans": [{"scopeSpans": [{"spans": [span(startTimeUnixNano=str(2**64))]}]}]}
        ).encode(),
        lambda: json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span(kind="SPAN_KIND_NOPE")]}]}]}).encode(),
        lambda: json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [7, span()]}]}]}).encode(),
        lambda: json.dumps([1, 2, 3]).encode(),
    ]
    return [(f"json-{i % len(makers)}", makers[i % len(makers)]()) for i in range(n)]


def _classify_http(status: int, body: bytes, as_json: bool) -> tuple[str, int]:
    if status == 200:
        if as_json:
            rejected = int(json.loads(body or b"{}").get("partialSuccess", {}).get("rejectedSpans", 0))
        else:
            rejected = ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans
        return ("partial" if rejected else "ok"), rejected
    return str(status), 0


def _sent_spans(body: bytes, as_json: bool) -> int:
    try:
        if as_json:
            doc = json.loads(body)
            return sum(len(ss.get("spans") or []) for rs in doc.get("resourceSpans") or []
                       for ss in rs.get("scopeSpans") or [])
        return sum(len(ss.spans) for rs in ExportTraceServiceRequest.FromString(body).resource_spans
                   for ss in rs.scope_spans)
    except Exception:  # noqa: BLE001 - unparsable: nothing can be accepted
        return 0


def bench_malformed(tmp: Path, quick: bool) -> dict[str, Any]:
    rng = random.Random(0)
    n = 300 if quick else 1200
    proto, js = _malformed_protobuf(rng, n // 2), _malformed_json(rng, n // 4)
    col = Collector(tmp / "malformed.duckdb").start()
    outcomes: dict[str, int] = {}
    accepted = 0
    channel = grpc.insecure_channel(col.grpc)
    export = channel.unary_unary(_EXPORT, request_serializer=None,
                                 response_deserializer=ExportTraceServiceResponse.FromString)
    for transport, cases in (("http-proto", proto), ("http-json", js), ("grpc", proto[: n // 4])):
        for _, body in cases:
            if transport == "grpc":
                try:
                    reply = export(body, timeout=30)
                    rejected = reply.partial_success.rejected_spans
                    key = "partial" if rejected else "ok"
                except grpc.RpcError as exc:
                    key, rejected = exc.code().name, 0
            else:
                as_json = transport == "http-json"
                status, _, reply = _post(f"{col.http}/v1/traces", body,
                                         "application/json" if as_json else "application/x-protobuf")
                key, rejected = _classify_http(status, reply, as_json)
            if key in ("ok", "partial"):
                accepted += _sent_spans(body, transport == "http-json") - rejected
            outcomes[f"{transport}:{key}"] = outcomes.get(f"{transport}:{key}", 0) + 1
    channel.close()
    stored = col.sql("SELECT count(*) AS n FROM spans")[0]["n"]
    col.stop()
    bad = {k: v for k, v in outcomes.items()
           if k.split(":")[1] not in ("ok", "partial", "400", "413", "INVALID_ARGUMENT")}
    return {"inputs": sum(outcomes.values()), "outcomes": outcomes, "retryable_or_5xx": bad,
            "accepted_spans": accepted, "stored_spans": stored, "store_exact": stored == accepted}


# --- SIGKILL under concurrent senders ----------------------------------------------------------------------
def bench_sigkill(tmp: Path, quick: bool) -> dict[str, Any]:
    col = Collector(tmp / "killed.duckdb").start()
    acked: list[str] = []
    lock = threading.Lock()
    rounds = 2 if quick else 4
    for _ in range(rounds):
        stop = threading.Event()

        def sender() -> None:
            with grpc.insecure_channel(col.grpc) as channel:
                export = channel.unary_unary(_EXPORT, request_serializer=None)
                while not stop.is_set():
                    req, ids = _request(100, payload=200)
                    try:
                        export(req.SerializeToString(), timeout=10)
                    except grpc.RpcError:
                        continue
                    with lock:
                        acked.extend(ids)

        threads = [threading.Thread(target=sender) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(random.uniform(2.0, 4.0))
        col.kill()  # mid-stream
        stop.set()
        for t in threads:
            t.join(60)
        col.start()
    found = col.count(acked)
    col.stop()
    return {"senders": 8, "kills": rounds, "acknowledged": len(acked), "found": found, "lost": len(acked) - found}


# --- overload with big requests -----------------------------------------------------------------------------
def bench_overload(tmp: Path, quick: bool) -> dict[str, Any]:
    body = _request(24_000, payload=1400)[0].SerializeToString()  # ~34 MiB
    return {transport: _overload(tmp, quick, body, transport) for transport in ("http", "grpc")}


def _overload(tmp: Path, quick: bool, body: bytes, transport: str) -> dict[str, Any]:
    inflight, queue, duck = 256 * _MiB, 256 * _MiB, 512 * _MiB
    col = Collector(tmp / f"overload-{transport}.duckdb", "--max-inflight-bytes", str(inflight),
                    "--max-queue-bytes", str(queue), "--duckdb-memory-limit", "512MB").start()
    counts: dict[str, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + (10 if quick else 30)

    def send_http() -> str:
        status, headers, _ = _post(f"{col.http}/v1/traces", body, "application/x-protobuf", 120)
        return f"{status}" + ("+retry-after" if status == 503 and "retry-after" in {k.lower() for k in headers} else "")

    def client() -> None:
        with grpc.insecure_channel(col.grpc, options=[("grpc.max_send_message_length", 128 * _MiB)]) as channel:
            export = channel.unary_unary(_EXPORT, request_serializer=None)
            while time.monotonic() < deadline:
                if transport == "http":
                    key = send_http()
                else:
                    try:
                        export(body, timeout=120)
                        key = "OK"
                    except grpc.RpcError as exc:
                        retry_info = "google.rpc.retryinfo-bin" in dict(exc.trailing_metadata() or ())
                        key = exc.code().name + ("+RetryInfo" if retry_info else "")
                with lock:
                    counts[key] = counts.get(key, 0) + 1
                if key not in ("200", "OK"):
                    time.sleep(0.2)

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peak = col.peak_rss_mib()
    col.stop()
    bound = (inflight + queue + duck) / _MiB + 500
    return {"clients": 6, "request_mib": round(len(body) / _MiB, 1), "answers": counts, "peak_rss_mib": round(peak),
            "bound_mib": round(bound), "within_bound": peak < bound}


# --- SQL abuse ----------------------------------------------------------------------------------------------
_ABUSE = [
    "SELECT * FROM read_text('/etc/passwd')", "SELECT * FROM read_blob('/etc/passwd')",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM glob('/*')", "COPY (SELECT 1) TO '{tmp}/out.csv'",
    "EXPLAIN ANALYZE COPY (SELECT 1) TO '{tmp}/out2.csv'",
    "EXPLAIN ANALYZE SET GLOBAL memory_limit='64MB'", "SET memory_limit='64MB'", "ATTACH '{tmp}/x.duckdb'",
    "INSTALL httpfs", "LOAD httpfs", "PRAGMA memory_limit='1MB'", "EXPLAIN ANALYZE DELETE FROM spans",
    "DROP TABLE spans",
    "SELECT 1; DROP TABLE spans", "CALL checkpoint()", "EXPORT DATABASE '{tmp}/exp'",
]


def bench_sql(tmp: Path, quick: bool) -> dict[str, Any]:
    col = Collector(tmp / "sql.duckdb", "--sql-timeout-s", "2").start()
    statuses = {}
    for q in _ABUSE:
        status, _, _ = _post(f"{col.http}/v1/sql", json.dumps({"sql": q.format(tmp=tmp)}).encode(), "application/json")
        statuses[q] = status
    written = [p.name for p in tmp.iterdir() if p.name in ("out.csv", "out2.csv", "x.duckdb", "exp")]
    slow = json.dumps({"sql": "SELECT count(*) FROM range(100000000) a, range(100000000) b"}).encode()
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        t0 = time.monotonic()
        futures = [pool.submit(_post, f"{col.http}/v1/sql", slow, "application/json", 120) for _ in range(6)]
        time.sleep(0.3)
        latencies = []
        body = _request(100)[0].SerializeToString()
        while not all(f.done() for f in futures):
            t1 = time.monotonic()
            _post(f"{col.http}/v1/traces", body, "application/x-protobuf")
            latencies.append(time.monotonic() - t1)
        answers = [f.result()[0] for f in futures]
        took = time.monotonic() - t0
    col.stop()
    latencies.sort()
    return {"abusive_queries": len(_ABUSE), "all_400": all(s == 400 for s in statuses.values()),
            "not_400": {q: s for q, s in statuses.items() if s != 400}, "files_written": written,
            "runaway_answers": answers, "runaway_all_done_s": round(took, 1), "exports_during": len(latencies),
            "export_p50_ms": round(1000 * latencies[len(latencies) // 2]), "export_max_ms": round(1000 * latencies[-1])}


# --- policy server ------------------------------------------------------------------------------------------
def _bad_policy_requests() -> list[tuple[str, bytes]]:
    msgs = '"messages": [{"role": "user", "content": "1 add 2"}]'
    raw = [
        '{"model": "tiny", %s, "temperature": NaN}' % msgs, '{"model": "tiny", %s, "top_p": NaN}' % msgs,
        '{"model": "tiny", %s, "temperature": Infinity, "stream": true}' % msgs,
        '{"model": "tiny", %s, "seed": 18446744073709551616}' % msgs,
        '{"model": "tiny", %s, "n": 1000}' % msgs, '{"model": "tiny", %s, "max_tokens": -1}' % msgs,
        '{"model": "tiny", %s, "stop": 5}' % msgs,
        '{"model": "other", %s}' % msgs, '{"model": "tiny", "messages": "hi"}',
        '{"model": "tiny", "messages": [{"role": "x"}]}',
        '{"model": "tiny", %s, "logprobs": "yes"}' % msgs,
        '{"model": "tiny", %s, "top_logprobs": 50, "logprobs": true}' % msgs,
        "{not json", "[]", "[" * 100_000 + "]" * 100_000, '{"a": %s}' % ("[" * 500 + "]" * 500),
        '{"model": "tiny", "messages": [{"role": "user", "content": "%s"}]}' % ("1 " * 3_000_000),
    ]
    return [(f"bad-{i}", r.encode()) for i, r in enumerate(raw)]


def bench_policy(tmp: Path, quick: bool) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    from spanrl.demo.tiny import build_tiny_model

    hf_logging.disable_progress_bar()
    model = build_tiny_model(tmp / "tiny", words=[str(i) for i in range(100)] + ["add", "sub", "what", "is", "?"],
                             seed=0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "spanrl", "serve", "--model", str(model), "--port", str(port),
                             "--served-model-name", "tiny", "--otlp-endpoint", "none", "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_health(base)
        bad = _bad_policy_requests() * (2 if quick else 13)
        valid = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "what is 1 add 2 ?"}],
                            "max_tokens": 4}).encode()
        jobs = [("valid", valid)] * 64 + bad
        random.Random(0).shuffle(jobs)
        health: list[float] = []
        stop = threading.Event()
        prober = threading.Thread(target=_probe, args=(base, health, stop))
        prober.start()
        with concurrent.futures.ThreadPoolExecutor(64 + 16) as pool:
            results = list(pool.map(lambda job: (job[0], _post_safe(f"{base}/v1/chat/completions", job[1])), jobs))
        stop.set()
        prober.join()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    valid_ok = sum(1 for kind, (status, _) in results if kind == "valid" and status == 200)
    bad_results = [(status, body) for kind, (status, body) in results if kind != "valid"]
    bad_4xx = sum(1 for status, body in bad_results if 400 <= status < 500 and _openai_error(body))
    return {"valid": 64, "valid_200": valid_ok, "bad": len(bad_results), "bad_4xx_openai": bad_4xx,
            "bad_other": sorted({s for s, b in bad_results if not (400 <= s < 500 and _openai_error(b))}),
            "health_max_ms": round(1000 * max(health or [0.0]))}


def _wait_health(base: str) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{base}/health", timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("policy server did not start")


def _probe(base: str, out: list[float], stop: threading.Event) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        urllib.request.urlopen(f"{base}/health", timeout=60).read()
        out.append(time.monotonic() - t0)
        time.sleep(0.05)


def _post_safe(url: str, body: bytes) -> tuple[int, bytes]:
    try:
        status, _, reply = _post(url, body, "application/json", 300)
        return status, reply
    except OSError as exc:  # a 413 answered before the body was sent may reset the upload
        return ((413, b'{"error": {"message": "reset after 413"}}') if "reset" in str(exc).lower()
                or "pipe" in str(exc).lower() else (0, b""))


def _openai_error(body: bytes) -> bool:
    try:
        return isinstance(json.loads(body)["error"]["message"], str)
    except (ValueError, KeyError, TypeError):
        return False


# --- unusable rewards (issue 28) -------------------------------------------------------------------------
_BAD_REWARDS: list[Any] = [float("nan"), float("inf"), float("-inf"), 1e200, 1e308, -1e7, "nan", "1e200"]
_REWARD_PLACES = (("attribute", "spanrl.reward.value"), ("spanrl.reward", "spanrl.reward.value"),
                  ("gen_ai.evaluation.result", "gen_ai.evaluation.score.value"))


def _reward_request(value: Any, place: tuple[str, str], rollout: str) -> bytes:
    """Four spans: a good reward, the bad one (where ``place`` says), two without a reward."""
    req, _ = _request(4, rollout=rollout)
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[0].attributes.add(key="spanrl.reward.value", value=common_pb2.AnyValue(double_value=0.5))
    any_value = (common_pb2.AnyValue(string_value=value) if isinstance(value, str)
                 else common_pb2.AnyValue(double_value=value))
    if place[0] == "attribute":
        spans[1].attributes.add(key=place[1], value=any_value)
    else:
        spans[1].events.add(name=place[0], time_unix_nano=5).attributes.add(key=place[1], value=any_value)
    return req.SerializeToString()


def _verdict(rollout: str, value: float, stamp: int | None) -> bytes:
    req, _ = _request(1, rollout=rollout)
    span = req.resource_spans[0].scope_spans[0].spans[0]
    span.name = "spanrl.feedback"
    span.attributes.add(key="spanrl.reward.value", value=common_pb2.AnyValue(double_value=value))
    if stamp is not None:
        span.start_time_unix_nano = span.end_time_unix_nano = stamp
    return req.SerializeToString()


def bench_rewards(tmp: Path, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for decoder in ("auto", "python"):
        os.environ["SPANRL_COLLECTOR_DECODER"] = decoder
        col = Collector(tmp / f"rewards-{decoder}.duckdb").start()
        os.environ.pop("SPANRL_COLLECTOR_DECODER")
        channel = grpc.insecure_channel(col.grpc)
        export = channel.unary_unary(_EXPORT, request_serializer=None,
                                     response_deserializer=ExportTraceServiceResponse.FromString)
        sent = rejected = with_reason = 0
        for i, (value, place, transport) in enumerate(
                (v, p, t) for v in _BAD_REWARDS for p in _REWARD_PLACES for t in ("grpc", "http")):
            body = _reward_request(value, place, f"r{i}")
            if transport == "grpc":
                reply = export(body, timeout=30)
            else:
                status, _, raw = _post(f"{col.http}/v1/traces", body, "application/x-protobuf")
                reply = ExportTraceServiceResponse.FromString(raw) if status == 200 else ExportTraceServiceResponse()
            sent += 1
            rejected += reply.partial_success.rejected_spans
            with_reason += "must be a finite number" in reply.partial_success.error_message
        for value, stamp in ((0.0, 2**62), (1.0, None)):  # a far-future verdict first, then the honest one
            export(_verdict("judged", value, stamp), timeout=30)
            time.sleep(0.01)
        stored = col.sql("SELECT count(*) AS n FROM spans WHERE rollout_id LIKE 'r%'")[0]["n"]
        unusable = col.sql("SELECT count(*) AS n FROM rewards WHERE NOT isfinite(value) OR abs(value) > 1e6")[0]["n"]
        final = col.sql("SELECT final_reward FROM rollouts WHERE rollout_id = 'judged'")[0]["final_reward"]
        channel.close()
        col.stop()
        out[decoder] = {"requests": sent, "rejected_spans": rejected, "with_reason": with_reason,
                        "stored_spans": stored, "stored_exact": stored == 3 * sent, "unusable_in_views": unusable,
                        "latest_verdict": final}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="malformed,sigkill,overload,sql,policy,rewards,abuse,bounds")
    parser.add_argument("--quick", action="store_true", help="smaller counts (a smoke run)")
    parser.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    benches = {"malformed": bench_malformed, "sigkill": bench_sigkill, "overload": bench_overload, "sql": bench_sql,
               "policy": bench_policy, "rewards": bench_rewards, "abuse": bench_abuse, "bounds": bench_bounds}
    figures: dict[str, Any] = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="spanrl-faults-") as tmp:
        for name in args.only.split(","):
            t0 = time.monotonic()
            figures[name] = benches[name](Path(tmp), args.quick)
            figures[name]["seconds"] = round(time.monotonic() - t0, 1)
            print(f"{name}: {json.dumps(figures[name])}", flush=True)
    figures["load_after"] = os.getloadavg()
    print(f"load average before {figures['load_before'][0]:.1f}, after {figures['load_after'][0]:.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
