"""``spanrl doctor [CONFIG]``: what a first run needs, checked in seconds, one line each: ``ok``, ``warn``
(it may bite) or ``FAIL`` (it will), and what to do.

Always: the Python, the torch build, which extras are installed, whether the default ports are free. With a
``spanrl train`` config: its agent command (program and script found, as the Trainer checks before its first
rollout). With a ``spanrl train --online`` config: the collector (``store_url``) and the policy server
(``server_url``) answer, and ``OTEL_EXPORTER_OTLP_ENDPOINT`` sends the agents' spans to that collector (unset,
an agent exports to localhost:4317 and its spans are lost when the collector listens elsewhere).
Exit status 1 when a check failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from spanrl import env
from spanrl.errors import SpanRLError
from spanrl.extras import missing_modules

__all__ = ["Check", "register", "run_checks"]

_PYTHON_MIN = (3, 10)
_TORCH_CPU = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
_PORTS = {env.DEFAULT_GRPC_PORT: "the collector's OTLP/gRPC", env.DEFAULT_HTTP_PORT: "the collector's OTLP/HTTP + SQL",
          env.DEFAULT_POLICY_PORT: "the policy server's", 4320: "spanrl ui's"}
_CONNECT_TIMEOUT_S = 2.0
_OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"


@dataclasses.dataclass
class Check:
    """One verdict: ``status`` is ``ok``, ``warn`` or ``FAIL``; ``fix`` says what to do (empty when ok)."""

    status: str
    what: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.status:<5} {self.what}" + (f": {self.fix}" if self.fix else "")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "doctor", help="check this machine (and a config) before a first run",
        description="Checks the Python, the torch build, the installed extras and the default ports; with a config, "
                    "its agent command, and for an online config the collector, the policy server and "
                    f"{_OTEL_ENDPOINT}. One line each (ok / warn / FAIL) with what to do; exit status 1 on a FAIL.",
    )
    p.add_argument("config", nargs="?", help="a spanrl train (or --online) YAML config to check too")
    p.add_argument("--port", type=int, action="append", default=None,
                   help=f"a port that must be free (repeatable; default {', '.join(map(str, _PORTS))})")
    p.set_defaults(func=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    checks = run_checks(Path(args.config) if args.config else None, ports=args.port)
    for check in checks:
        print(check.line())
    return 1 if any(c.status == "FAIL" for c in checks) else 0


def run_checks(config: Path | None = None, *, ports: list[int] | None = None) -> list[Check]:
    """Every check, in the order printed."""
    checks = [_python(), *_extras(), _torch(), *(_port(p) for p in (list(_PORTS) if ports is None else ports))]
    if config is not None:
        checks += _config_checks(config)
    return checks


def _python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info < _PYTHON_MIN:
        return Check("FAIL", f"python {version}", "spanrl needs Python 3.10 or newer")
    return Check("ok", f"python {version} ({sys.executable})")


def _extras() -> list[Check]:
    checks = []
    for extra in ("collector", "serve", "train"):
        absent = missing_modules(extra)
        checks.append(Check("ok", f"extra [{extra}] installed") if not absent else
                      Check("warn", f"extra [{extra}] not installed (missing: {', '.join(absent)})",
                            f"pip install 'spanrl[{extra}]' if you need it (torch first: {_TORCH_CPU})"))
    return checks


def _torch() -> Check:
    if importlib.util.find_spec("torch") is None:
        return Check("warn", "torch not installed", f"training and serving need it: {_TORCH_CPU}")
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    what = f"torch {torch.__version__} ({build} build)"
    if torch.version.cuda and not torch.cuda.is_available():
        return Check("warn", f"{what}, no GPU here", f"the CPU wheel is a fraction of the size: {_TORCH_CPU}")
    return Check("ok", what)


def _port(port: int) -> Check:
    name = f" ({_PORTS[port]} default)" if port in _PORTS else ""
    with socket.socket() as sock:
        try:
            sock.bind((env.DEFAULT_HOST, port))
        except OSError:
            return Check("warn", f"port {port}{name} is in use",
                         "fine if that is your own spanrl service; else start it on another port, and for the "
                         f"collector give agents {_OTEL_ENDPOINT}=http://127.0.0.1:PORT")
    return Check("ok", f"port {port}{name} is free")


def _config_checks(path: Path) -> list[Check]:
    from spanrl.trainer.train_config import read_config

    try:
        raw = read_config(path)
    except SpanRLError as exc:
        return [Check("FAIL", f"config {path}", str(exc))]
    checks = [Check("ok", f"config {path} is valid YAML")]
    if "agent" in raw:
        checks.append(_agent(raw["agent"], path.parent))
    if raw.get("store_url"):
        checks += _collector(str(raw["store_url"]))
    if raw.get("server_url"):
        checks.append(_answers(f"{str(raw['server_url']).rstrip('/')}/health", "policy server",
                               "start `spanrl serve` there, or fix server_url"))
    return checks


def _agent(value: Any, base: Path) -> Check:
    from spanrl.trainer.train_config import agent_command
    from spanrl.trainer.preflight import check_agent_command

    try:
        agent = agent_command(value, base)
        check_agent_command(agent)
    except SpanRLError as exc:
        return Check("FAIL", "agent", str(exc).removeprefix("agent: "))
    return Check("ok", f"agent {' '.join(map(str, agent)) if isinstance(agent, list) else agent} found")


def _answers(url: str, what: str, fix: str) -> Check:
    import httpx

    try:
        httpx.get(url, timeout=_CONNECT_TIMEOUT_S).raise_for_status()
    except httpx.HTTPError as exc:
        return Check("FAIL", f"{what} at {url}: {type(exc).__name__}: {exc}", fix)
    return Check("ok", f"{what} answers at {url}")


def _collector(store_url: str) -> list[Check]:
    """The collector answers at ``store_url``, and the agents' OTLP endpoint reaches a collector's port."""
    checks = [_answers(f"{store_url.rstrip('/')}/health", "collector", "start `spanrl collector`, or fix store_url")]
    http = urlsplit(store_url)
    endpoint = os.environ.get(_OTEL_ENDPOINT)
    if endpoint is None:
        if http.port not in (None, env.DEFAULT_HTTP_PORT):
            checks.append(Check("warn", f"{_OTEL_ENDPOINT} is unset and the collector's HTTP port is {http.port}",
                                f"agents then export to 127.0.0.1:{env.DEFAULT_GRPC_PORT} and their spans are lost "
                                f"unless the collector's gRPC port is that one: export {_OTEL_ENDPOINT}="
                                f"http://{http.hostname}:GRPC_PORT (or :{http.port} with "
                                "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)"))
        return checks
    otlp = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}")
    if otlp.hostname is None or otlp.port is None:
        return checks + [Check("FAIL", f"{_OTEL_ENDPOINT}={endpoint}", "give it as http://HOST:PORT")]
    loopback = {"127.0.0.1", "localhost", "::1"}
    same_host = otlp.hostname == http.hostname or {otlp.hostname, http.hostname} <= loopback
    try:
        socket.create_connection((otlp.hostname, otlp.port), timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return checks + [Check("FAIL", f"{_OTEL_ENDPOINT}={endpoint}: nothing listens there ({exc.strerror or exc})",
                               "point it at the collector's OTLP port (its gRPC port, 4317 by default)")]
    if not same_host:
        return checks + [Check("warn", f"{_OTEL_ENDPOINT}={endpoint} is another host than store_url's "
                               f"({http.hostname})", "the agents' spans go to another collector than the one read")]
    return checks + [Check("ok", f"{_OTEL_ENDPOINT}={endpoint} is listening, on the collector's host")]
