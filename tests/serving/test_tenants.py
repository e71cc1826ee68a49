"""Rollouts owned end to end (issue 53, finding 3): API keys name tenants, and a tenant cannot name another's rollout,
conversation or trace. The probe: with no credential, ``POST /rollouts/<victim>/v1/chat/completions`` (or the
``x-spanrl-rollout-id`` header, or ``metadata.conversation_id``) answered 200 and its span joined the victim's
rollout."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spanrl import semconv
from spanrl.errors import ConfigError
from spanrl.serving import PolicyServer, ServerConfig
from spanrl.serving.tenants import Tenants, read_api_key_file

_KEYS = {"key-alice": "alice", "key-bob": "bob"}
_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "1 add 2"}], "max_tokens": 2}
_ROUTES = {
    "chat/completions": _CHAT,
    "completions": {"model": "tiny", "prompt": "1 add 2", "max_tokens": 2},
    "responses": {"model": "tiny", "input": "1 add 2", "max_output_tokens": 2},
    "messages": {"model": "tiny", "messages": [{"role": "user", "content": "1 add 2"}], "max_tokens": 2},
}


@pytest.fixture(scope="module")
def keyed(tiny_model_dir: pathlib.Path) -> Iterator[tuple[PolicyServer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    config = ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny", api_keys=_KEYS)
    with PolicyServer(config, span_exporter=exporter) as server:
        yield server.start(), exporter


def _post(server: PolicyServer, path: str, key: str | None, body: dict | None = None, **headers: str) -> httpx.Response:
    auth = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.base_url + path, json=body or _CHAT, headers={**auth, **headers}, timeout=60)


@pytest.mark.parametrize("key", [None, "key-mallory", "key-alic"])
def test_every_v1_route_needs_a_known_key(keyed, key):
    server, _ = keyed
    reply = _post(server, "/v1/chat/completions", key)
    assert reply.status_code == 401, reply.text
    assert reply.json()["error"]["code"] == "invalid_api_key" and "--api-key-file" in reply.json()["error"]["message"]
    assert reply.headers["www-authenticate"] == "Bearer"
    models = httpx.get(server.base_url + "/v1/models", headers={"authorization": f"Bearer {key}"} if key else {})
    assert models.status_code == 401
    assert httpx.get(server.base_url + "/health").status_code == 200  # probes need no key


@pytest.mark.parametrize("route", sorted(_ROUTES))
def test_a_tenant_cannot_name_another_tenants_rollout_on_any_route(keyed, route):
    server, exporter = keyed
    victim = f"victim-{route.replace('/', '-')}"
    assert _post(server, f"/rollouts/{victim}/v1/{route}", "key-alice", _ROUTES[route]).status_code == 200
    server.force_flush()
    exporter.clear()
    refused = _post(server, f"/rollouts/{victim}/v1/{route}", "key-bob", _ROUTES[route])
    assert refused.status_code == 403, refused.text
    assert f"rollout {victim!r} belongs to another tenant" in refused.json()["error"]["message"]
    by_header = _post(server, f"/v1/{route}", "key-bob", _ROUTES[route], **{"x-spanrl-rollout-id": victim})
    assert by_header.status_code == 403
    server.force_flush()
    assert exporter.get_finished_spans() == ()  # nothing of bob's joined the victim's rollout
    assert _post(server, f"/rollouts/{victim}/v1/{route}", "key-alice", _ROUTES[route]).status_code == 200


def test_conversations_and_traces_belong_to_the_tenant_that_opened_them(keyed):
    server, exporter = keyed
    server.force_flush()
    exporter.clear()
    talk = {**_CHAT, "metadata": {"conversation_id": "conv-a1"}}
    trace = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    assert _post(server, "/v1/chat/completions", "key-alice", talk, traceparent=trace).status_code == 200
    conversation = _post(server, "/v1/chat/completions", "key-bob", talk)
    assert conversation.status_code == 403 and "conversation 'conv-a1'" in conversation.json()["error"]["message"]
    baggage = _post(server, "/v1/chat/completions", "key-bob", baggage="gen_ai.conversation.id=conv-a1")
    assert baggage.status_code == 403
    traced = _post(server, "/v1/chat/completions", "key-bob", traceparent=trace)
    assert traced.status_code == 403 and f"trace {'ab' * 16!r}" in traced.json()["error"]["message"]
    assert _post(server, "/v1/chat/completions", "key-bob", {**_CHAT, "metadata": {"conversation_id": "conv-b1"}}
                 ).status_code == 200  # bob's own
    server.force_flush()
    spans = exporter.get_finished_spans()
    assert [(s.attributes[semconv.TENANT], s.attributes[semconv.GEN_AI_CONVERSATION_ID]) for s in spans] == [
        ("alice", "conv-a1"), ("bob", "conv-b1")]


def test_bound_ids_are_forgotten_oldest_first_past_the_cap():
    tenants = Tenants({"k": "a", "j": "b"}, max_ids=2)
    for rollout in ("r1", "r2", "r3"):
        tenants.bind("a", {semconv.ROLLOUT_ID: rollout}, {})
    tenants.bind("b", {semconv.ROLLOUT_ID: "r1"}, {})  # r1 was forgotten: bob may open it now
    with pytest.raises(Exception, match="rollout 'r3' belongs to another tenant"):
        tenants.bind("b", {semconv.ROLLOUT_ID: "r3"}, {})


def test_the_key_file_maps_keys_to_tenants(tmp_path, caplog):
    (tmp_path / "keys").write_text("# key tenant\nk1 alice\n\nk2 bob\n")
    (tmp_path / "keys").chmod(0o600)
    assert read_api_key_file(tmp_path / "keys") == {"k1": "alice", "k2": "bob"}
    assert not caplog.records
    (tmp_path / "keys").chmod(0o644)
    read_api_key_file(tmp_path / "keys")
    assert [r.getMessage() for r in caplog.records] == [
        f"api_key_file {tmp_path / 'keys'} can be read by other users of this machine: chmod 600 it"]
    (tmp_path / "one").write_text("only-key\n")
    assert read_api_key_file(tmp_path / "one") == {"only-key": "default"}
    (tmp_path / "bad").write_text("k1 alice extra\n")
    with pytest.raises(ConfigError, match="line 1: expected 'KEY TENANT', got 3 fields"):
        read_api_key_file(tmp_path / "bad")


def test_keyless_serving_is_refused_beyond_loopback_and_said_on_it(tiny_model_dir, caplog):
    with caplog.at_level("WARNING", logger="spanrl.serving.server"), \
            PolicyServer(ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None)) as server:
        server.start()
    assert [r.getMessage() for r in caplog.records if "API keys" in r.getMessage()] == [
        "policy server: no API keys (--api-key-file): every client on this machine may name any rollout, "
        "conversation or trace; keyless serving is allowed on loopback only"]
    with pytest.raises(ConfigError, match="api_keys: a server bound to 0.0.0.0 .* needs API keys"):
        ServerConfig(model=tiny_model_dir, host="0.0.0.0").validate()
    ServerConfig(model=tiny_model_dir, host="0.0.0.0", api_keys={"k": "t"}).validate()
    assert "s3cret-k" not in repr(ServerConfig(model=tiny_model_dir, api_keys={"s3cret-k": "t"}))
    done = subprocess.run([sys.executable, "-m", "spanrl", "serve", "--model", str(tiny_model_dir), "--host", "0.0.0.0",
                           "--port", "0", "--otlp-endpoint", "none"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--api-key-file" in done.stderr, done.stderr


def _foreign_end(rollout_id: str, service: str) -> bytes:
    """An ERROR ``spanrl.rollout`` span of ``service`` naming ``rollout_id`` (the attack on a conversation)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Status

    req = ExportTraceServiceRequest()
    spans = req.resource_spans.add()
    spans.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=service)))
    span = spans.scope_spans.add().spans.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="spanrl.rollout",
                                             kind=1, start_time_unix_nano=1, end_time_unix_nano=2)
    span.attributes.append(KeyValue(key=semconv.ROLLOUT_ID, value=AnyValue(string_value=rollout_id)))
    span.status.code = Status.STATUS_CODE_ERROR
    return req.SerializeToString()


def test_a_span_of_another_service_cannot_fail_or_claim_a_conversation(tiny_model_dir, collector):
    """The probe: one ERROR spanrl.rollout span of service 'mallory' naming 'conversation:<id>' turned the victim's
    conversation rollout to status 'error' and claimed it."""
    import grpc
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    config = ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=collector.grpc_endpoint, served_model_name="tiny",
                          api_keys=_KEYS)
    with PolicyServer(config) as server:
        server.start()
        talk = {**_CHAT, "metadata": {"conversation_id": "conv-v"}}
        assert _post(server, "/v1/chat/completions", "key-alice", talk).status_code == 200
        server.force_flush()
    state = "SELECT status, span_count FROM rollout_state(0) WHERE rollout_id = 'conversation:conv-v'"
    assert collector.store.sql(state).to_pylist() == [{"status": "open", "span_count": 1}]
    with grpc.insecure_channel(collector.grpc_endpoint) as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                     response_deserializer=ExportTraceServiceResponse.FromString)
        reply = export(_foreign_end("conversation:conv-v", "mallory"), timeout=30)
    assert reply.partial_success.rejected_spans == 1
    assert "'conversation:conv-v' is the rollout of the policy server's calls" in reply.partial_success.error_message
    assert collector.store.sql(state).to_pylist() == [{"status": "open", "span_count": 1}]
