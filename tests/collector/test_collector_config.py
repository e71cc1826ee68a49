"""CollectorConfig defaults, environment, and exact messages for bad fields."""

from __future__ import annotations

import pytest

from spanrl.collector import Collector, CollectorConfig, default_config
from spanrl.errors import CollectorError, ConfigError


def test_defaults_validate_and_match_the_spec():
    config = default_config()
    config.validate()
    assert (config.host, config.grpc_port, config.http_port, config.token) == ("127.0.0.1", 4317, 4318, None)
    assert config.max_request_bytes == 64 * 1024 * 1024
    assert default_config() is not config


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"db_path": ""}, "db_path must be a file path or ':memory:', got an empty string"),
        ({"host": "my host"}, "host must be an IP address or 'localhost', got 'my host'"),
        ({"grpc_port": 70000}, "grpc_port must be -1 (off), 0 (any free port) or 1..65535, got 70000"),
        ({"http_port": -2}, "http_port must be -1 (off), 0 (any free port) or 1..65535, got -2"),
        ({"grpc_port": -1, "http_port": -1}, "grpc_port and http_port are both -1"),
        ({"token": "two words"}, "token must be a non-empty string without whitespace"),
        ({"max_request_bytes": 0}, "max_request_bytes must be at least 1, got 0"),
        ({"shutdown_timeout_s": 0}, "shutdown_timeout_s must be positive (seconds), got 0"),
        ({"duckdb_memory_limit": "lots"}, "duckdb_memory_limit must be a size such as '1GB' or '512MiB', got 'lots'"),
        ({"duckdb_checkpoint_threshold": "1 fortnight"}, "duckdb_checkpoint_threshold must be a size such as '1GB'"),
        ({"duckdb_threads": 0}, "duckdb_threads must be None or at least 1, got 0"),
    ],
)
def test_bad_field_is_named(fields, message):
    with pytest.raises(ConfigError) as err:
        CollectorConfig(**fields).validate()
    assert message in str(err.value)


def test_from_env_then_overrides(monkeypatch):
    monkeypatch.setenv("SPANRL_DB", "/tmp/env.duckdb")
    monkeypatch.setenv("SPANRL_COLLECTOR_GRPC_PORT", "5317")
    monkeypatch.setenv("SPANRL_COLLECTOR_HTTP_PORT", "not-a-port")
    monkeypatch.setenv("SPANRL_COLLECTOR_TOKEN", "tok")
    config = CollectorConfig.from_env(grpc_port=None, token="arg")
    assert (config.db_path, config.grpc_port, config.http_port, config.token) == ("/tmp/env.duckdb", 5317, 4318, "arg")


def test_port_in_use_is_collector_error(collector, tmp_path):
    port = int(collector.grpc_endpoint.rsplit(":", 1)[1])
    with pytest.raises(CollectorError, match="cannot bind OTLP/gRPC"):
        Collector(CollectorConfig(db_path=str(tmp_path / "other.duckdb"), grpc_port=port, http_port=0)).start()


def test_shutdown_before_start_and_twice_is_safe(tmp_path):
    c = Collector(CollectorConfig(db_path=str(tmp_path / "x.duckdb"), grpc_port=0, http_port=0))
    c.shutdown()
    c.shutdown()
    with pytest.raises(CollectorError, match="cannot start a collector that is stopped; create a new one"):
        c.start()


def test_store_and_limit_settings_from_env_then_flags(monkeypatch):
    monkeypatch.setenv("SPANRL_DUCKDB_MEMORY_LIMIT", "3GB")
    monkeypatch.setenv("SPANRL_DUCKDB_CHECKPOINT_THRESHOLD", "64MB")
    monkeypatch.setenv("SPANRL_COLLECTOR_MAX_INFLIGHT_BYTES", "1000000")
    monkeypatch.setenv("SPANRL_COLLECTOR_SQL_TIMEOUT_S", "2.5")
    config = CollectorConfig.from_env(duckdb_memory_limit="2GB")
    config.validate()
    assert (config.duckdb_memory_limit, config.duckdb_checkpoint_threshold) == ("2GB", "64MB")
    assert (config.max_inflight_bytes, config.sql_timeout_s) == (1_000_000, 2.5)
    with pytest.raises(ConfigError, match="sql_timeout_s must be positive"):
        CollectorConfig(sql_timeout_s=float("nan")).validate()
    with pytest.raises(ConfigError, match="duckdb_memory_limit must be a size"):
        CollectorConfig(duckdb_memory_limit="lots").validate()
    with pytest.raises(ConfigError, match="materialize_interval_s must be positive"):
        CollectorConfig(materialize_interval_s=0).validate()
    CollectorConfig(materialize_interval_s=None).validate()  # off


def test_duckdb_threads_flag_reaches_the_store(tmp_path):
    """`spanrl collector --duckdb-threads N` sets DuckDB's worker threads (the insert's CPU lever)."""
    import json
    import subprocess
    import sys
    import urllib.request

    bad = subprocess.run([sys.executable, "-m", "spanrl", "collector", "--duckdb-threads", "0",
                          "--db", str(tmp_path / "a.duckdb")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "spanrl: error: duckdb_threads must be None or at least 1, got 0" in bad.stderr
    config = CollectorConfig(db_path=str(tmp_path / "b.duckdb"), grpc_port=-1, http_port=0, duckdb_threads=1)
    collector = Collector(config)
    collector.start()
    try:
        req = urllib.request.Request(f"{collector.http_endpoint}/v1/sql", method="POST",
                                     headers={"content-type": "application/json"},
                                     data=json.dumps({"sql": "SELECT current_setting('threads') AS t"}).encode())
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert json.loads(resp.read())["rows"] == [{"t": 1}]
    finally:
        collector.shutdown()
