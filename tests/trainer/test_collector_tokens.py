"""The Trainer's own collector guards every scope (issue 53, finding 2): it had no token at all, and bound
0.0.0.0 when ``rollouts.advertise_host`` said so, so anyone who reached it could read, prune or forge the
training store. Now it makes a token per scope for the run (in memory), honours the operator's
``SPANRL_COLLECTOR_*TOKEN`` (and ``*_TOKEN_FILE``), and hands agents the ingest token the way any OTel SDK
reads it (``OTEL_EXPORTER_OTLP_HEADERS``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from spanrl.rollouts.policy_pool import ServingConfig
from spanrl.trainer.services import Services

# An agent that knows nothing of spanrl: the OTel SDK's exporter, configured by the environment alone.
_PLAIN_OTEL_AGENT = """
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
with provider.get_tracer("agent").start_as_current_span("plain-agent-span"):
    pass
provider.shutdown()
"""


def _post(base: str, path: str, body: bytes, token: str | None = None) -> int:
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(f"{base}{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def services(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("SPANRL_COLLECTOR_") or name.startswith("OTEL_EXPORTER_OTLP"):
            monkeypatch.delenv(name)
    (tmp_path / "read.token").write_text("operator-reader\n")
    monkeypatch.setenv("SPANRL_COLLECTOR_READ_TOKEN_FILE", str(tmp_path / "read.token"))
    s = Services()
    s.start_collector(tmp_path / "t.duckdb", ServingConfig(), reachable=True)
    yield s
    s.close()


def test_every_scope_is_guarded_and_the_operators_token_is_honoured(services):
    collector = services.collector
    tokens = services.collector_tokens
    assert collector.config.host == "0.0.0.0" and collector.config.open_scopes() is None
    assert tokens["read_token"] == "operator-reader" and tokens["token"] is None
    made = [tokens[k] for k in ("ingest_token", "policy_token", "admin_token")]
    assert len(set(made)) == 3 and all(len(t) >= 32 for t in made)  # secrets.token_urlsafe(24), one per scope
    base = f"http://127.0.0.1:{collector.http_endpoint.rsplit(':', 1)[1]}"
    sql = b'{"sql": "SELECT count(*) AS n FROM spans"}'
    assert _post(base, "/v1/sql", sql) == 401 and _post(base, "/v1/sql", sql, tokens["ingest_token"]) == 401
    assert _post(base, "/v1/sql", sql, "operator-reader") == 200
    assert _post(base, "/v1/prune", b'{"older_than_s": 0}') == 401
    assert _post(base, "/v1/prune", b'{"older_than_s": 0}', tokens["admin_token"]) == 200
    assert services.policy_headers() == {"authorization": f"Bearer {tokens['policy_token']}"}
    assert "operator-reader" not in repr(collector.config)


def test_a_plain_otel_agent_exports_with_the_ingest_token_it_is_given(services):
    otel_env = services.agent_otel_env()
    token = services.collector_tokens["ingest_token"]
    assert otel_env["OTEL_EXPORTER_OTLP_HEADERS"] == f"authorization=Bearer%20{token}"
    assert otel_env["SPANRL_COLLECTOR_INGEST_TOKEN"] == token
    assert "operator-reader" not in json.dumps(otel_env)  # an agent gets the ingest token only
    without = {k: v for k, v in otel_env.items() if k != "OTEL_EXPORTER_OTLP_HEADERS"}
    for agent_env in (without, otel_env):
        subprocess.run([sys.executable, "-c", _PLAIN_OTEL_AGENT], env={**os.environ, **agent_env}, check=True,
                       timeout=120, capture_output=True)
    # the span sent without the token was refused (UNAUTHENTICATED); the one with it is stored
    assert services.collector.store.sql("SELECT count(*) AS n FROM spans").to_pylist() == [{"n": 1}]


def test_an_agent_gets_no_token_file_but_the_ingest_ones(tmp_path):
    """The *_TOKEN_FILE variants name files an agent (the same user) could read: only the ingest ones pass."""
    from spanrl.rollouts.runner import RunnerConfig, _agent_env

    environ = {f"{name}{suffix}": str(tmp_path / name) for name in (
        "SPANRL_COLLECTOR_TOKEN", "SPANRL_COLLECTOR_READ_TOKEN", "SPANRL_COLLECTOR_ADMIN_TOKEN",
        "SPANRL_COLLECTOR_POLICY_TOKEN", "SPANRL_POLICY_ADMIN_TOKEN", "SPANRL_COLLECTOR_INGEST_TOKEN",
    ) for suffix in ("", "_FILE")}
    got = _agent_env(environ, {}, RunnerConfig(), ["python", "agent.py"])
    tokens = {k for k in got if "TOKEN" in k}
    assert tokens == {"SPANRL_COLLECTOR_INGEST_TOKEN", "SPANRL_COLLECTOR_INGEST_TOKEN_FILE"}, tokens


def test_servers_the_trainer_did_not_start_take_the_operators_api_key(tmp_path, monkeypatch):
    """serving.urls servers bound beyond loopback need keys; the agents must send one they know: the operator's
    SPANRL_POLICY_API_KEY(_FILE), else a new key per run that only the Trainer's own server takes."""
    monkeypatch.delenv("SPANRL_POLICY_API_KEY", raising=False)
    assert Services().api_key != Services().api_key  # per run, in memory
    key = tmp_path / "api.key"
    key.write_text("k-operator\n")
    key.chmod(0o600)
    monkeypatch.setenv("SPANRL_POLICY_API_KEY_FILE", str(key))
    assert Services().api_key == "k-operator"


def test_the_users_otlp_headers_keep_the_ingest_token():
    """runner.env's own OTEL_EXPORTER_OTLP_HEADERS (a tenant header, say) no longer replaces the ingest token's
    header: the agent's spans would be refused (401) for want of it."""
    from spanrl.rollouts.agent_env import ingest_token_env, otlp_headers
    from spanrl.rollouts.runner import RunnerConfig, _agent_env

    otel_env = ingest_token_env("ingest-secret", {})
    got = _agent_env({}, otel_env, RunnerConfig(env={"OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=a%20b"}), None)
    assert otlp_headers(got) == {"x-tenant": "a b", "authorization": "Bearer ingest-secret"}
