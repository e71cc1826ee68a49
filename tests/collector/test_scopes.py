"""Who may do what on the collector: tokens per scope, no cross-site or DNS-rebinding requests, and token ids
kept only from the policy server's token (issue 28, findings 4, 5, 7)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from spanrl.collector import Collector, CollectorConfig
from _otlp import kv as _kv, make_request

_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_TOKENS = {"token": "all-of-it", "ingest_token": "agent-t", "policy_token": "policy-t", "read_token": "reader-t",
           "admin_token": "admin-t"}
_SCOPE_OF_PATH = {"/v1/traces": "ingest", "/v1/sql": "read", "/v1/prune": "admin", "/v1/materialize": "admin"}


def _post(collector, path: str, body: bytes, *, ctype: str = "application/json", token: str | None = None,
          headers: dict | None = None) -> tuple[int, bytes]:
    h = {"content-type": ctype, **(headers or {})}
    if token:
        h["authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"{collector.http_endpoint}{path}", data=body, headers=h, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _body(path: str) -> tuple[bytes, str]:
    if path == "/v1/traces":
        return make_request(1)[0].SerializeToString(), "application/x-protobuf"
    return json.dumps({"/v1/sql": {"sql": "SELECT 1 AS x"}, "/v1/prune": {"older_than_s": 1e9},
                       "/v1/materialize": {}}[path]).encode(), "application/json"


def _grpc(collector, body: bytes, token: str | None) -> ExportTraceServiceResponse:
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        call = channel.unary_unary(_EXPORT, request_serializer=None,
                                   response_deserializer=ExportTraceServiceResponse.FromString)
        return call(body, metadata=[("authorization", f"Bearer {token}")] if token else None, timeout=30)


@pytest.fixture(scope="module")
def scoped(tmp_path_factory):
    config = CollectorConfig(db_path=str(tmp_path_factory.mktemp("scopes") / "s.duckdb"), grpc_port=0, http_port=0,
                             materialize_interval_s=None, **_TOKENS)
    with Collector(config) as c:
        yield c


@pytest.mark.parametrize("path", list(_SCOPE_OF_PATH))
@pytest.mark.parametrize("holder", ["token", "ingest_token", "read_token", "admin_token", None])
def test_each_route_takes_only_tokens_of_its_scope(scoped, path, holder):
    body, ctype = _body(path)
    status, reply = _post(scoped, path, body, ctype=ctype, token=_TOKENS.get(holder))
    allowed = holder == "token" or holder == f"{_SCOPE_OF_PATH[path]}_token"
    assert status == (200 if allowed else 401), reply


@pytest.mark.parametrize("holder", ["token", "ingest_token", "policy_token"])
def test_grpc_export_takes_ingest_scoped_tokens(scoped, holder):
    _grpc(scoped, make_request(1)[0].SerializeToString(), _TOKENS[holder])


@pytest.mark.parametrize("holder", ["read_token", "admin_token", None])
def test_grpc_export_refuses_other_scopes(scoped, holder):
    with pytest.raises(grpc.RpcError) as info:
        _grpc(scoped, make_request(1)[0].SerializeToString(), _TOKENS.get(holder))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_agent_token_cannot_read_or_prune_other_tenants(scoped):
    """Finding 4: the token agents get (SPANRL_COLLECTOR_INGEST_TOKEN) reads no prompts and deletes nothing."""
    assert _post(scoped, "/v1/sql", b'{"sql": "SELECT * FROM spans"}', token=_TOKENS["ingest_token"])[0] == 401
    assert _post(scoped, "/v1/prune", b'{"older_than_s": 0}', token=_TOKENS["ingest_token"])[0] == 401


@pytest.fixture
def open_collector(tmp_path):
    """No token at all: the loopback default."""
    with Collector(CollectorConfig(db_path=str(tmp_path / "o.duckdb"), grpc_port=-1, http_port=0,
                                   materialize_interval_s=None)) as c:
        status, _ = _post(c, "/v1/traces", make_request(5)[0].SerializeToString(), ctype="application/x-protobuf")
        assert status == 200
        yield c


def _count(collector) -> int:
    status, reply = _post(collector, "/v1/sql", b'{"sql": "SELECT count(*) AS n FROM spans"}')
    assert status == 200, reply
    return json.loads(reply)["rows"][0]["n"]


@pytest.mark.parametrize("path", ["/v1/prune", "/v1/sql", "/v1/materialize", "/v1/traces"])
def test_simple_text_plain_post_is_refused(open_collector, path):
    """Finding 5: a web page's "simple" POST (text/plain, no preflight) wiped the store."""
    body = b'{"older_than_s": 0}' if path == "/v1/prune" else _body(path)[0]
    status, reply = _post(open_collector, path, body, ctype="text/plain",
                          headers={"origin": "http://evil.example"} if path == "/v1/sql" else None)
    assert status in (403, 415), reply
    status, _ = _post(open_collector, path, body, ctype="text/plain")
    assert status == 415
    assert _count(open_collector) == 5


def test_foreign_origin_is_refused_even_as_json(open_collector):
    for origin in ("http://evil.example", "null", "http://127.0.0.1:1"):
        status, reply = _post(open_collector, "/v1/prune", b'{"older_than_s": 0}', headers={"origin": origin})
        assert status == 403, (origin, reply)
        assert b"cross-site" in reply
    assert _count(open_collector) == 5


def test_own_origin_is_accepted(open_collector):
    own = open_collector.http_endpoint
    status, _ = _post(open_collector, "/v1/sql", b'{"sql": "SELECT 1 AS x"}', headers={"origin": own})
    assert status == 200


@pytest.mark.parametrize("path", ["/v1/sql", "/health"])
def test_dns_rebinding_host_is_refused_on_loopback(open_collector, path):
    """Finding 5: a page on evil.example that resolves to 127.0.0.1 sends Host: evil.example."""
    port = open_collector.http_endpoint.rsplit(":", 1)[1]
    if path == "/health":
        req = urllib.request.Request(f"{open_collector.http_endpoint}/health", headers={"host": f"evil.example:{port}"})
    else:
        req = urllib.request.Request(f"{open_collector.http_endpoint}{path}", data=b'{"sql": "SELECT * FROM spans"}',
                                     headers={"host": f"evil.example:{port}", "content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert info.value.code == 403
    assert b"DNS rebinding" in info.value.read()
    localhost = urllib.request.Request(f"{open_collector.http_endpoint}/health", headers={"host": f"localhost:{port}"})
    with urllib.request.urlopen(localhost, timeout=30) as resp:
        assert resp.status == 200


def _llm_server_span(rollout: str, response_id: str) -> bytes:
    """A SERVER span with token ids, log-probs and a response id, as the policy server writes them."""
    req, _ = make_request(1, rollout_id=rollout, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.response.id": response_id,
        "spanrl.llm.prompt_token_ids": [1, 2, 3], "spanrl.llm.completion_token_ids": [4, 5],
        "spanrl.llm.logprobs": [-0.5, -0.25]})
    span = req.resource_spans[0].scope_spans[0].spans[0]
    span.kind = 2  # SERVER
    return req.SerializeToString()


def _stored(collector, rollout: str) -> dict:
    status, reply = _post(collector, "/v1/sql", json.dumps({
        "sql": "SELECT response_id, prompt_token_ids, completion_token_ids, logprobs, attributes "
               "FROM spans WHERE rollout_id = ?", "params": [rollout]}).encode(), token=_TOKENS["read_token"])
    assert status == 200, reply
    (row,) = json.loads(reply)["rows"]
    return row


@pytest.mark.parametrize("via", ["http", "grpc"])
def test_token_ids_from_an_agent_token_are_not_kept(scoped, via):
    """Finding 7: a forged kind=SERVER span with token ids became a training transition. Only the policy
    server's token keeps token ids, log-probs and a SERVER span's response id."""
    for holder, rollout in (("ingest_token", f"forged-{via}"), ("policy_token", f"served-{via}")):
        body = _llm_server_span(rollout, f"chatcmpl-{rollout}")
        if via == "grpc":
            _grpc(scoped, body, _TOKENS[holder])
        else:
            assert _post(scoped, "/v1/traces", body, ctype="application/x-protobuf", token=_TOKENS[holder])[0] == 200
    forged, served = _stored(scoped, f"forged-{via}"), _stored(scoped, f"served-{via}")
    assert ((forged["response_id"], forged["prompt_token_ids"], forged["completion_token_ids"], forged["logprobs"])
            == (None,) * 4)
    assert "chatcmpl-forged" in forged["attributes"]  # what was sent is kept for people to read
    assert served["response_id"] == f"chatcmpl-served-{via}"
    assert served["prompt_token_ids"] == [1, 2, 3] and served["completion_token_ids"] == [4, 5]


def test_token_ids_are_kept_from_everyone_when_no_token_grants_policy(open_collector):
    body = _llm_server_span("open-r", "chatcmpl-open")
    assert _post(open_collector, "/v1/traces", body, ctype="application/x-protobuf")[0] == 200
    status, reply = _post(open_collector, "/v1/sql", b'{"sql": "SELECT response_id, completion_token_ids FROM spans '
                                                     b'WHERE rollout_id = \'open-r\'"}')
    assert json.loads(reply)["rows"] == [{"response_id": "chatcmpl-open", "completion_token_ids": [4, 5]}]


def test_cli_token_files_and_variables(tmp_path):
    """``spanrl collector --ingest-token-file/--admin-token-file`` and SPANRL_COLLECTOR_READ_TOKEN, then
    ``spanrl store prune --token-file`` with the admin token (and not the read one)."""
    import os
    import subprocess
    import sys
    import threading

    for name, value in (("ingest", "file-agent"), ("admin", "file-admin"), ("read", "var-reader")):
        (tmp_path / name).write_text(value + "\n")
    env = {**os.environ, "SPANRL_COLLECTOR_READ_TOKEN": "var-reader"}
    env.pop("SPANRL_COLLECTOR_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "spanrl", "collector", "--db", str(tmp_path / "c.duckdb"),
                             "--grpc-port", "-1", "--http-port", "0", "--ingest-token-file", str(tmp_path / "ingest"),
                             "--admin-token-file", str(tmp_path / "admin")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        assert line and line[0].startswith("spanrl collector ready"), line
        http = dict(p.split("=", 1) for p in line[0].split()[3:])["http"]

        class _At:
            http_endpoint = http

        body = make_request(3)[0].SerializeToString()
        assert _post(_At, "/v1/traces", body, ctype="application/x-protobuf", token="file-agent")[0] == 200
        assert _post(_At, "/v1/traces", body, ctype="application/x-protobuf", token="var-reader")[0] == 401
        assert _post(_At, "/v1/sql", b'{"sql": "SELECT 1 AS x"}', token="var-reader")[0] == 200
        assert _post(_At, "/v1/sql", b'{"sql": "SELECT 1 AS x"}', token="file-agent")[0] == 401
        prune = [sys.executable, "-m", "spanrl", "store", "prune", "--older-than", "0s", "--url", http]
        refused = subprocess.run([*prune, "--token-file", str(tmp_path / "read")], capture_output=True, text=True,
                                 env=env, timeout=120)
        assert refused.returncode != 0 and "401" in refused.stderr
        done = subprocess.run([*prune, "--token-file", str(tmp_path / "admin")], capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 0, done.stderr
    finally:
        proc.terminate()
        proc.wait(30)


def _export(collector, body: bytes, token: str | None = None) -> ExportTraceServiceResponse:
    status, reply = _post(collector, "/v1/traces", body,
                          ctype="application/json" if body[:1] == b"{" else "application/x-protobuf", token=token)
    assert status == 200, reply
    return ExportTraceServiceResponse.FromString(reply)


def test_a_rollout_claimed_by_one_service_cannot_be_joined_by_another(open_collector):
    """Finding 7: a span-level spanrl.rollout.id let one tenant's spans join another's rollout."""
    victim, _ = make_request(2, rollout_id="victim-r", resource={"service.name": "tenant-a"})
    assert _export(open_collector, victim.SerializeToString()).partial_success.rejected_spans == 0
    # tenant b: its resource names its own rollout, one span names the victim's (the span attribute wins)
    forged, _ = make_request(3, rollout_id="b-r", resource={"service.name": "tenant-b"})
    span = forged.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.extend([_kv("spanrl.rollout.id", "victim-r"), _kv("spanrl.reward.value", 1.0)])
    reply = _export(open_collector, forged.SerializeToString())
    assert reply.partial_success.rejected_spans == 1
    assert "rollout 'victim-r' belongs to service 'tenant-a', not 'tenant-b'" in reply.partial_success.error_message
    status, rows = _post(open_collector, "/v1/sql",
                         b'{"sql": "SELECT rollout_id, service_name, count(*) AS n FROM spans '
                         b'WHERE rollout_id IN (\'victim-r\', \'b-r\') GROUP BY ALL ORDER BY 1"}')
    assert json.loads(rows)["rows"] == [{"rollout_id": "b-r", "service_name": "tenant-b", "n": 2},
                                         {"rollout_id": "victim-r", "service_name": "tenant-a", "n": 2}]
    # the owner keeps writing to it; feedback from any service is still taken
    more, _ = make_request(1, rollout_id="victim-r", resource={"service.name": "tenant-a"})
    assert _export(open_collector, more.SerializeToString()).partial_success.rejected_spans == 0
    feedback, _ = make_request(1, rollout_id="victim-r", name="spanrl.feedback", resource={"service.name": "judge"})
    assert _export(open_collector, feedback.SerializeToString()).partial_success.rejected_spans == 0


def test_claims_survive_a_restart(tmp_path):
    db = str(tmp_path / "claims.duckdb")
    first, _ = make_request(1, rollout_id="kept-r", resource={"service.name": "tenant-a"})
    with Collector(CollectorConfig(db_path=db, grpc_port=-1, http_port=0, materialize_interval_s=None)) as c:
        _export(c, first.SerializeToString())
    intruder, _ = make_request(1, rollout_id="kept-r", resource={"service.name": "tenant-b"})
    with Collector(CollectorConfig(db_path=db, grpc_port=-1, http_port=0, materialize_interval_s=None)) as c:
        assert _export(c, intruder.SerializeToString()).partial_success.rejected_spans == 1


def test_a_prune_forgets_the_claims_of_the_rollouts_it_deleted(tmp_path):
    """Claims live in memory; a prune that deletes a rollout frees its claim (memory is bounded by the store),
    except for a rollout a batch named in the last minute: its spans may not be committed yet."""
    db = str(tmp_path / "claims.duckdb")
    config = CollectorConfig(db_path=db, grpc_port=-1, http_port=0, materialize_interval_s=None)
    old, _ = make_request(1, rollout_id="old-r", resource={"service.name": "tenant-a"})
    with Collector(config) as c:
        _export(c, old.SerializeToString())
    with Collector(config) as c:  # "old-r" is a claim loaded from the store, named by no batch since
        fresh, _ = make_request(1, rollout_id="fresh-r", resource={"service.name": "tenant-a"})
        _export(c, fresh.SerializeToString())
        assert _post(c, "/v1/prune", b'{"older_than_s": 0}') == (200, b'{"deleted_spans":2}')
        taken = [make_request(1, rollout_id=rid, resource={"service.name": "tenant-b"})[0]
                 for rid in ("old-r", "fresh-r")]
        assert [_export(c, t.SerializeToString()).partial_success.rejected_spans for t in taken] == [0, 1]


def test_the_policy_servers_spans_do_not_claim_the_rollout(scoped):
    """The policy server's span often arrives before the agent's: it must not take the rollout."""
    assert _post(scoped, "/v1/traces", _llm_server_span("agent-r", "chatcmpl-agent-r"), ctype="application/x-protobuf",
                 token=_TOKENS["policy_token"])[0] == 200
    agent, _ = make_request(2, rollout_id="agent-r", resource={"service.name": "the-agent"})
    reply = _export(scoped, agent.SerializeToString(), token=_TOKENS["ingest_token"])
    assert reply.partial_success.rejected_spans == 0
