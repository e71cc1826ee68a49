"""The collector fails closed (issue 53, finding 1): a scope no token grants is closed once any token is set;
with no token at all every scope is open, said in one start-up line, and only on loopback.

The probe: ``spanrl collector --ingest-token-file t`` answered ``{"deleted_spans": 2}`` to a prune with no
token, and served /v1/sql and /v1/materialize the same way, logging nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from _otlp import make_request
from spanrl.collector import Collector, CollectorConfig
from spanrl.errors import ConfigError
from test_scopes import _llm_server_span, _post


def _start(args: list[str], tmp_path, env: dict | None = None) -> tuple[subprocess.Popen, str, list[str]]:
    """A ``spanrl collector`` process, its HTTP endpoint and (growing) stderr lines."""
    env = {k: v for k, v in (env or os.environ).items() if not k.startswith("SPANRL_COLLECTOR_")}
    proc = subprocess.Popen([sys.executable, "-m", "spanrl", "collector", "--db", str(tmp_path / "c.duckdb"),
                             "--grpc-port", "-1", "--http-port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True).start()
    line = proc.stdout.readline()
    assert line.startswith("spanrl collector ready"), (line, errors)
    return proc, dict(p.split("=", 1) for p in line.split()[3:])["http"], errors


class _At:
    def __init__(self, http: str) -> None:
        self.http_endpoint = http


def test_ingest_token_alone_closes_sql_prune_and_materialize(tmp_path):
    """The probe's shape: 2 spans in, then prune / SQL / materialize with no token (and with the agent's)."""
    (tmp_path / "t").write_text("agent-t\n")
    proc, http, errors = _start(["--ingest-token-file", str(tmp_path / "t")], tmp_path)
    try:
        at = _At(http)
        assert _post(at, "/v1/traces", make_request(2)[0].SerializeToString(), ctype="application/x-protobuf",
                     token="agent-t")[0] == 200
        for path, body in (("/v1/prune", b'{"older_than_s": 0}'), ("/v1/sql", b'{"sql": "SELECT 1 AS x"}'),
                           ("/v1/materialize", b"{}")):
            for token in (None, "agent-t"):
                status, reply = _post(at, path, body, token=token)
                assert status == 401, (path, reply)
            assert json.loads(reply)["message"].endswith(
                "this server has none configured, so the scope is closed (fail closed); start it with "
                f"--{'read' if path == '/v1/sql' else 'admin'}-token-file (or --token-file for every scope)")
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    assert "scopes policy, read, admin, so they are closed to everyone" in "".join(errors)
    from spanrl.store import SpanStore

    with SpanStore.open(tmp_path / "c.duckdb", read_only=True) as store:
        assert store.span_count() == 2  # nothing pruned


def test_without_a_policy_token_no_senders_token_ids_are_kept(tmp_path):
    """Finding 1: "with no policy token, forged token ids count again" (an ingest token and nothing else)."""
    config = CollectorConfig(db_path=str(tmp_path / "s.duckdb"), grpc_port=-1, http_port=0, ingest_token="agent-t",
                             read_token="read-t", materialize_interval_s=None)
    with Collector(config) as c:
        assert _post(c, "/v1/traces", _llm_server_span("forged", "chatcmpl-f"), ctype="application/x-protobuf",
                     token="agent-t")[0] == 200
        rows = c.store.sql("SELECT response_id, completion_token_ids FROM spans").to_pylist()
    assert rows == [{"response_id": None, "completion_token_ids": None}]


def test_no_token_on_loopback_is_said_in_one_line(tmp_path):
    proc, http, errors = _start([], tmp_path)
    try:
        assert _post(_At(http), "/v1/sql", b'{"sql": "SELECT 1 AS x"}')[0] == 200
    finally:
        proc.terminate()
        proc.wait(30)
    said = [line for line in errors if "open to anyone" in line]
    assert len(said) == 1 and said[0].rstrip().endswith(
        "collector: no token configured, so the scopes ingest, policy, read, admin are open to anyone on this "
        "machine; allowed because it is bound to loopback (127.0.0.1): development only"), errors


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_beyond_loopback_with_an_open_scope_refuses_to_start(tmp_path, host):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPANRL_COLLECTOR_")}
    done = subprocess.run([sys.executable, "-m", "spanrl", "collector", "--db", str(tmp_path / "c.duckdb"),
                           "--host", host, "--grpc-port", "0", "--http-port", "-1"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2  # a bad setting: the exit status of bad input, the one error line
    assert done.stderr.startswith(f"spanrl: error: collector: host {host} is beyond loopback and the scopes ingest, "
                                  "policy have no token, so anyone who reaches it could use them: refused "
                                  "(fail closed)") and done.stderr.count("\n") == 1
    assert not (tmp_path / "c.duckdb").exists()
    with pytest.raises(ConfigError, match="the scopes ingest, policy, read, admin have no token"):
        CollectorConfig(host=host).validate()
    CollectorConfig(host=host, ingest_token="i").validate()  # every other scope closed: nothing open


def test_a_config_repr_never_shows_a_token():
    """Finding 7: config reprs showed tokens (a log line or a traceback of the config leaked them)."""
    config = CollectorConfig(token="all-s3cret", ingest_token="in-s3cret", policy_token="po-s3cret",
                             read_token="re-s3cret", admin_token="ad-s3cret")
    assert "s3cret" not in repr(config) and "s3cret" not in str(config)
