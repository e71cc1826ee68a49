"""``spanrl doctor``: one line per check with what to do, exit status 1 on a FAIL. The mistakes of a first hour:
a port taken, a misspelt agent file, a collector on other ports with OTEL_EXPORTER_OTLP_ENDPOINT unset (the agents'
spans go to 4317 and are lost), an endpoint nothing listens on, a server that is not running."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spanrl.doctor import run_checks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_doctor_names_a_taken_port_and_a_misspelt_agent(tmp_path: Path) -> None:
    (tmp_path / "train.yaml").write_text("model: m\nagent: python my_agnet.py\ntasks: [{id: a}]\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "spanrl", "doctor", str(tmp_path / "train.yaml"), "--port",
                               str(port)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert lines[0].startswith(f"ok    python {sys.version_info.major}.{sys.version_info.minor}.")
    assert "ok    extra [train] installed" in lines and any(line.startswith("ok    torch 2.") for line in lines)
    assert f"warn  port {port} is in use: fine if that is your own spanrl service; else start it on another port, " \
           "and for the collector give agents OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:PORT" in lines
    assert f"ok    config {tmp_path / 'train.yaml'} is valid YAML" in lines
    assert lines[-1] == (
        f"FAIL  agent: no such file 'my_agnet.py' (agent: {sys.executable} my_agnet.py; a relative path is looked up "
        f"next to the config, then in the current folder {tmp_path}): fix the file name in agent")


def _online(tmp_path: Path, store_url: str, server_url: str) -> Path:
    path = tmp_path / "online.yaml"
    path.write_text(json.dumps({"model": "m", "store_url": store_url, "server_url": server_url}))
    return path


def test_doctor_checks_the_collector_the_server_and_the_otlp_endpoint(collector: Any, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store_url, nobody = collector.http_endpoint, f"http://127.0.0.1:{_free_port()}"
    http_port = int(store_url.rsplit(":", 1)[1])
    config = _online(tmp_path, store_url, nobody)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    lines = [c.line() for c in run_checks(config, ports=[])[5:]]  # after python, three extras, torch
    assert lines[0] == f"ok    config {config} is valid YAML"
    assert lines[1] == f"ok    collector answers at {store_url}/health"
    assert lines[2] == (
        f"warn  OTEL_EXPORTER_OTLP_ENDPOINT is unset and the collector's HTTP port is {http_port}: agents then export "
        f"to 127.0.0.1:4317 and their spans are lost unless the collector's gRPC port is that one: export "
        f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:GRPC_PORT (or :{http_port} with "
        "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)")
    assert lines[3].startswith(f"FAIL  policy server at {nobody}/health: ConnectError: ") and lines[3].endswith(
        ": start `spanrl serve` there, or fix server_url")

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", nobody)
    lines = [c.line() for c in run_checks(config, ports=[])[7:9]]
    assert lines[0].startswith(f"FAIL  OTEL_EXPORTER_OTLP_ENDPOINT={nobody}: nothing listens there (")
    assert lines[0].endswith("): point it at the collector's OTLP port (its gRPC port, 4317 by default)")

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{collector.grpc_endpoint}")
    lines = [c.line() for c in run_checks(config, ports=[])[7:9]]
    assert lines[0] == f"ok    OTEL_EXPORTER_OTLP_ENDPOINT=http://{collector.grpc_endpoint} is listening, on the " \
                       "collector's host"
