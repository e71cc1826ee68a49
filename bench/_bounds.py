"""The ``bounds`` section of bench/faults.py: the collector fails closed and bounds what a caller can hold
(issue 53, findings 1, 5, 6, 7). Every collector its own ``spanrl collector`` subprocess on 127.0.0.1.

Cases, each with the answer it must get:
  closed     a collector with an ingest token only: prune, SQL and materialize with no token and with the
             agents' token: 401, the store unchanged; no token at all bound to 0.0.0.0: refused to start (exit 1).
  sql        ``SELECT * FROM range(5000000)`` (the probe: 0.27 -> 2.04 GB, 36.5 s): 400 naming the row cap, with
             its time and the collector's peak RSS growth; a data-modifying CTE: 400, nothing deleted; 1M rows
             as JSON under a 0.5 s limit: 400 naming the limit.
  grpc       4 client-streaming Export calls that never send, then one real export (the probe: 30 s, then
             UNAVAILABLE): its latency with the 10 s default receive deadline.
  bad input  prune ``older_than_s: 1e308``: 400, no Retry-After; /health with the disk full (RLIMIT_FSIZE 4 MB): 503
             ``failing``.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from _abuse import _call, _spans

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_JSON = {"content-type": "application/json"}
_PB = {"content-type": "application/x-protobuf"}


def _start(db: Path, *flags: str, preexec: Any = None) -> tuple[subprocess.Popen[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPANRL_COLLECTOR_")}
    proc = subprocess.Popen([sys.executable, "-m", "spanrl", "collector", "--db", str(db), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, preexec_fn=preexec)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line.startswith("spanrl collector ready"):
        raise RuntimeError(f"collector did not start: {line!r}")
    return proc, dict(p.split("=", 1) for p in line.split()[3:])


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(60)


def _peak_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _closed(tmp: Path) -> dict[str, Any]:
    token = tmp / "ingest.token"
    token.write_text("bench-agent\n")
    token.chmod(0o600)
    proc, at = _start(tmp / "closed.duckdb", "--grpc-port", "-1", "--http-port", "0", "--ingest-token-file", str(token))
    try:
        http = at["http"]
        _call(f"{http}/v1/traces", _spans("r", "a", 20), **_PB, authorization="Bearer bench-agent")
        cases = [(path, body, auth) for path, body in (("/v1/prune", b'{"older_than_s": 0}'),
                                                       ("/v1/sql", b'{"sql": "SELECT * FROM spans"}'),
                                                       ("/v1/materialize", b"{}"))
                 for auth in ({}, {"authorization": "Bearer bench-agent"})]
        not_401 = [(path, status) for path, body, auth in cases
                   for status, _ in [_call(f"{http}{path}", body, **_JSON, **auth)] if status != 401]
    finally:
        _stop(proc)
    from spanrl.store import SpanStore

    with SpanStore.open(tmp / "closed.duckdb", read_only=True) as store:
        kept = store.span_count()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPANRL_COLLECTOR_")}
    wide = subprocess.run([sys.executable, "-m", "spanrl", "collector", "--db", str(tmp / "wide.duckdb"), "--host",
                           "0.0.0.0", "--grpc-port", "0", "--http-port", "0"], capture_output=True, text=True,
                          env=env, timeout=120)
    return {"cases": len(cases), "not_401": not_401, "spans_sent": 20, "spans_kept": kept,
            "no_token_0.0.0.0_exit": wide.returncode, "no_token_0.0.0.0_says": wide.stderr.strip().splitlines()[-1]}


def _sql(tmp: Path) -> dict[str, Any]:
    proc, at = _start(tmp / "sql.duckdb", "--grpc-port", "-1", "--http-port", "0", "--sql-timeout-s", "0.5")
    try:
        http = at["http"]
        _call(f"{http}/v1/traces", _spans("r", "a", 20), **_PB)
        before = _peak_mib(proc.pid)
        t0 = time.monotonic()
        status, body = _call(f"{http}/v1/sql", b'{"sql": "SELECT * FROM range(5000000)"}', **_JSON)
        took = time.monotonic() - t0
        grown = _peak_mib(proc.pid) - before
        cte, cte_body = _call(f"{http}/v1/sql", b'{"sql": "WITH d AS (DELETE FROM spans RETURNING *) '
                                                b'SELECT count(*) FROM d"}', **_JSON)
        slow, slow_body = _call(f"{http}/v1/sql", b'{"sql": "SELECT * FROM range(1000000)"}', **_JSON)
        left = json.loads(_call(f"{http}/v1/sql", b'{"sql": "SELECT count(*) AS n FROM spans"}', **_JSON)[1])
    finally:
        _stop(proc)
    return {"range_5m": status, "range_5m_s": round(took, 2), "range_5m_peak_growth_mib": round(grown),
            "range_5m_says": json.loads(body)["message"], "delete_cte": cte, "delete_cte_says": json.loads(cte_body)
            ["message"], "spans_after_cte": left["rows"][0]["n"], "json_1m_rows_0.5s_limit": slow,
            "json_1m_says": json.loads(slow_body)["message"]}


def _grpc(tmp: Path) -> dict[str, Any]:
    proc, at = _start(tmp / "grpc.duckdb", "--grpc-port", "0", "--http-port", "-1")
    stop = threading.Event()

    def never_sends() -> Any:
        stop.wait(120)
        yield from ()

    channels = [grpc.insecure_channel(at["grpc"]) for _ in range(5)]
    try:
        idle = [ch.stream_unary(_EXPORT, request_serializer=None, response_deserializer=None).future(never_sends())
                for ch in channels[:4]]
        time.sleep(0.5)
        t0 = time.monotonic()
        call = channels[4].unary_unary(_EXPORT, request_serializer=None, response_deserializer=None)
        try:
            call(_spans("g", "a", 10), timeout=60)
            outcome = "OK"
        except grpc.RpcError as exc:
            outcome = exc.code().name
        took = time.monotonic() - t0
        idle_codes = sorted({_code(f) for f in idle})
    finally:
        stop.set()
        for ch in channels:
            ch.close()
        _stop(proc)
    return {"export_beside_4_idle": outcome, "export_s": round(took, 1), "idle_calls": idle_codes}


def _code(future: Any) -> str:
    try:
        future.result(timeout=60)
        return "OK"
    except grpc.RpcError as exc:
        return exc.code().name


def _bad_input(tmp: Path) -> dict[str, Any]:
    def full_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4_000_000, resource.RLIM_INFINITY))

    proc, at = _start(tmp / "full.duckdb", "--grpc-port", "-1", "--http-port", "0", preexec=full_disk)
    try:
        http = at["http"]
        prune, prune_body = _call(f"{http}/v1/prune", b'{"older_than_s": 1e308}', **_JSON)
        for i in range(200):
            status, _ = _call(f"{http}/v1/traces", _spans(f"r{i}", "a", 200), **_PB)
            if status != 200:
                break
        health, health_body = _call(f"{http}/health")
    finally:
        _stop(proc)
    return {"prune_1e308": prune, "prune_says": json.loads(prune_body)["message"], "export_when_full": status,
            "health_when_full": health, "health_doc": json.loads(health_body)}


def bench_bounds(tmp: Path, quick: bool) -> dict[str, Any]:
    """The four groups of cases; ``quick`` changes nothing (each runs in seconds)."""
    return {"closed": _closed(tmp), "sql": _sql(tmp), "grpc": _grpc(tmp), "bad_input": _bad_input(tmp)}
