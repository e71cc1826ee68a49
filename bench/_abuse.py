"""The ``abuse`` section of bench/faults.py: who may do what (issue 28). Every server its own subprocess.

Cases, each with the answer it must get:
  cross-site   text/plain POSTs (prune, SQL, OTLP), JSON POSTs with a foreign or ``null`` Origin, requests with a
               DNS-rebinding Host, to a collector with no token (the loopback default): 415 / 403, store unchanged.
  scopes       the agents' ingest token on /v1/sql, /v1/prune, /v1/materialize; read and admin tokens on OTLP: 401.
  identity     SERVER spans with token ids and a response id sent with the ingest token: stored without them;
               spans naming a rollout another service claimed: rejected (partial success).
  reload       the policy server's reload without / with a wrong admin token (401), as a browser's text/plain or
               cross-origin POST (415 / 403), of paths outside the checkpoint root or Hub ids (one 400 message,
               no path echoed, answered in well under a second): the policy version never moves.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                    ExportTraceServiceResponse)
from opentelemetry.proto.common.v1 import common_pb2

_TOKENS = {"ingest": "bench-agent", "read": "bench-read", "admin": "bench-admin", "policy": "bench-policy"}
_EVIL = "http://evil.example"


def _call(url: str, body: bytes | None = None, **headers: str) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _spans(rollout: str, service: str, n: int = 4, *, server: bool = False, span_rollout: str | None = None) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for key, value in (("service.name", service), ("spanrl.rollout.id", rollout)):
        rs.resource.attributes.add(key=key, value=common_pb2.AnyValue(string_value=value))
    ss = rs.scope_spans.add()
    trace = os.urandom(16)
    for i in range(n):
        span = ss.spans.add(trace_id=trace, span_id=os.urandom(8), name="s", kind=2 if server else 1,
                            start_time_unix_nano=1000 + i, end_time_unix_nano=2000 + i)
        if server:
            span.attributes.add(key="gen_ai.response.id",
                                value=common_pb2.AnyValue(string_value=f"chatcmpl-{rollout}-{i}"))
            span.attributes.add(key="spanrl.llm.completion_token_ids", value=common_pb2.AnyValue(
                array_value=common_pb2.ArrayValue(values=[common_pb2.AnyValue(int_value=t) for t in (4, 5)])))
        if span_rollout and i == 0:
            span.attributes.add(key="spanrl.rollout.id", value=common_pb2.AnyValue(string_value=span_rollout))
    return req.SerializeToString()


def _collector(db: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "spanrl", "collector", "--db", str(db), "--grpc-port", "-1",
                             "--http-port", "0", *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    if not line.startswith("spanrl collector ready"):
        raise RuntimeError(f"collector did not start: {line!r}")
    return proc, dict(p.split("=", 1) for p in line.split()[3:])["http"]


def _count(http: str, token: str | None = None) -> int:
    auth = {"authorization": f"Bearer {token}"} if token else {}
    status, body = _call(f"{http}/v1/sql", b'{"sql": "SELECT count(*) AS n FROM spans"}',
                         **{"content-type": "application/json"}, **auth)
    assert status == 200, body
    return json.loads(body)["rows"][0]["n"]


def _cross_site(tmp: Path) -> dict[str, Any]:
    proc, http = _collector(tmp / "open.duckdb")
    try:
        _call(f"{http}/v1/traces", _spans("open-r", "a", 20), **{"content-type": "application/x-protobuf"})
        before = _count(http)
        port = http.rsplit(":", 1)[1]
        prune, sql = b'{"older_than_s": 0}', b'{"sql": "SELECT * FROM spans"}'
        cases = [("/v1/prune", prune, {"content-type": "text/plain"}, 415),
                 ("/v1/sql", sql, {"content-type": "text/plain", "origin": _EVIL}, 403),
                 ("/v1/traces", _spans("x", "b"), {"content-type": "text/plain"}, 415),
                 ("/v1/materialize", b"{}", {"content-type": "application/x-www-form-urlencoded"}, 415)]
        cases += [(path, body, {"content-type": "application/json", "origin": origin}, 403)
                  for path, body in (("/v1/prune", prune), ("/v1/sql", sql)) for origin in (_EVIL, "null")]
        cases += [(path, body, {"content-type": "application/json", "host": f"evil.example:{port}"}, 403)
                  for path, body in (("/v1/prune", prune), ("/v1/sql", sql), ("/health", None))]
        wrong = [(path, status, want) for path, body, headers, want in cases
                 for status, _ in [_call(f"{http}{path}", body, **headers)] if status != want]
        return {"cases": len(cases), "wrong": wrong, "spans_before": before, "spans_after": _count(http)}
    finally:
        proc.terminate()
        proc.wait(60)


def _scopes_and_identity(tmp: Path) -> dict[str, Any]:
    # on a command line: a bench only
    flags = [f for scope, token in _TOKENS.items() for f in (f"--{scope}-token", token)]
    proc, http = _collector(tmp / "scoped.duckdb", *flags)
    try:
        bearer = {scope: {"authorization": f"Bearer {token}"} for scope, token in _TOKENS.items()}
        json_type, pb_type = {"content-type": "application/json"}, {"content-type": "application/x-protobuf"}
        cases = [("/v1/sql", b'{"sql": "SELECT * FROM spans"}', {**json_type, **bearer["ingest"]}),
                 ("/v1/prune", b'{"older_than_s": 0}', {**json_type, **bearer["ingest"]}),
                 ("/v1/materialize", b"{}", {**json_type, **bearer["ingest"]}),
                 ("/v1/prune", b'{"older_than_s": 0}', {**json_type, **bearer["read"]}),
                 ("/v1/traces", _spans("s", "a"), {**pb_type, **bearer["read"]}),
                 ("/v1/traces", _spans("s", "a"), {**pb_type, **bearer["admin"]})]
        not_401 = [(path, status) for path, body, headers in cases
                   for status, _ in [_call(f"{http}{path}", body, **headers)] if status != 401]
        _call(f"{http}/v1/traces", _spans("forged-r", "tenant-b", server=True), **pb_type, **bearer["ingest"])
        _call(f"{http}/v1/traces", _spans("served-r", "policy-server", server=True), **pb_type, **bearer["policy"])
        _call(f"{http}/v1/traces", _spans("victim-r", "tenant-a"), **pb_type, **bearer["ingest"])
        status, reply = _call(f"{http}/v1/traces", _spans("b-r", "tenant-b", span_rollout="victim-r"), **pb_type,
                              **bearer["ingest"])
        joined = ExportTraceServiceResponse.FromString(reply).partial_success
        query = ("SELECT rollout_id, count(*) FILTER (WHERE completion_token_ids IS NOT NULL) AS ids, "
                 "count(response_id) AS response_ids, count(*) AS n FROM spans GROUP BY ALL ORDER BY 1")
        _, rows = _call(f"{http}/v1/sql", json.dumps({"sql": query}).encode(), **json_type, **bearer["read"])
        stored = {r["rollout_id"]: (r["ids"], r["response_ids"], r["n"]) for r in json.loads(rows)["rows"]}
        return {"scope_cases": len(cases), "scope_not_401": not_401,
                "forged_ids_kept": stored["forged-r"][:2], "policy_ids_kept": stored["served-r"][:2],
                "join_rejected": joined.rejected_spans, "join_reason": joined.error_message,
                "victim_spans": stored["victim-r"][2]}
    finally:
        proc.terminate()
        proc.wait(60)


def _reload(tmp: Path) -> dict[str, Any]:
    from transformers.utils import logging as hf_logging

    from spanrl.demo.tiny import build_tiny_model

    hf_logging.disable_progress_bar()
    words = [str(i) for i in range(100)] + ["add", "sub", "what", "is", "?"]
    model = build_tiny_model(tmp / "reload-tiny", words=words, seed=0)
    root = tmp / "ckpts"
    build_tiny_model(root / "checkpoint-1", words=words, seed=1)
    (tmp / "admin.token").write_text("bench-reload\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "spanrl", "serve", "--model", str(model), "--port", str(port),
                             "--served-model-name", "tiny", "--otlp-endpoint", "none", "--threads", "1",
                             "--admin-token-file", str(tmp / "admin.token"), "--checkpoint-root", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while _call_ok(f"{base}/health") is False:
            if time.monotonic() > deadline:
                raise RuntimeError("policy server did not start")
            time.sleep(0.5)
        url, auth = f"{base}/v1/weights/reload", {"authorization": "Bearer bench-reload"}
        good = json.dumps({"path": str(root / "checkpoint-1")}).encode()
        json_type = {"content-type": "application/json"}
        refused = [(good, {**json_type}, 401), (good, {**json_type, "authorization": "Bearer nope"}, 401),
                   (good, {"content-type": "text/plain", **auth}, 415),
                   (good, {**json_type, **auth, "origin": _EVIL}, 403),
                   (good, {**json_type, **auth, "host": f"evil.example:{port}"}, 403)]
        outside = [str(model), "/etc", "/nonexistent/weights", "../", "gpt2", "openai-community/gpt2", str(tmp)]
        refused += [(json.dumps({"path": p}).encode(), {**json_type, **auth}, 400) for p in outside]
        wrong, messages, slowest = [], set(), 0.0
        for body, headers, want in refused:
            t0 = time.monotonic()
            status, reply = _call(url, body, **headers)
            slowest = max(slowest, time.monotonic() - t0)
            if status != want:
                wrong.append((want, status))
            if want == 400:
                messages.add(json.loads(reply)["error"]["message"])
        version = json.loads(_call(f"{base}/health")[1])["policy_version"]
        status, _ = _call(url, good, **json_type, **auth)
        return {"cases": len(refused), "wrong": wrong, "messages_for_outside_paths": sorted(messages),
                "slowest_refusal_ms": round(1000 * slowest), "version_after_refusals": version,
                "admin_reload_status": status}
    finally:
        proc.terminate()
        proc.wait(60)


def _call_ok(url: str) -> bool:
    try:
        return _call(url)[0] == 200
    except OSError:
        return False


def bench_abuse(tmp: Path, quick: bool) -> dict[str, Any]:
    """The three groups of cases; ``quick`` changes nothing (each runs in seconds)."""
    return {"cross_site": _cross_site(tmp), "scopes": _scopes_and_identity(tmp), "reload": _reload(tmp)}
