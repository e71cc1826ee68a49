"""The environment of a command-line agent's rollout: beside ``SPANRL_*`` (for spanrl-aware agents), the
standard ``OTEL_RESOURCE_ATTRIBUTES`` carries the rollout ids, so that any OTel SDK, in any language,
puts them on every span with nothing spanrl-specific installed (docs/conventions.md, "Without spanrl in
the agent").

``OTEL_SERVICE_NAME``: the user's when they set it (the variable, or ``service.name`` in their
``OTEL_RESOURCE_ATTRIBUTES``), else the agent command's script name (`agent_service_env`), so the viewer
and the collector's rollout claims show ``agent`` rather than the SDK's ``unknown_service:python3``. A name
the agent sets in code still wins in Python; the Node.js SDK lets the variable override it."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import PurePath

from spanrl import env

__all__ = ["agent_credentials", "agent_service_env", "agent_service_name", "encode_otlp_headers", "ingest_token_env",
           "kept_ingest_header", "otel_rollout_env", "otlp_headers"]

# Tokens an agent never needs: reading other tenants' spans, pruning, reloading the served weights.
# Each may come as its *_FILE variant too (a path the agent, running as the same user, could read).
_NOT_FOR_AGENTS = tuple(
    name + suffix
    for name in (env.SPANRL_COLLECTOR_TOKEN, env.SPANRL_COLLECTOR_READ_TOKEN, env.SPANRL_COLLECTOR_ADMIN_TOKEN,
                 env.SPANRL_COLLECTOR_POLICY_TOKEN, env.SPANRL_POLICY_ADMIN_TOKEN)
    for suffix in ("", env.TOKEN_FILE_SUFFIX)
)

_TRACES_ONLY = ("OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER")
_OTEL_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
# Commands whose first plain argument is the agent's script (python agent.py, node agent.js)
_INTERPRETER = re.compile(r"(python[\d.]*|pypy[\d.]*|node|bun|deno|tsx|ts-node|ruby|perl|bash|sh)(\.exe)?")
_LAUNCHERS = ("opentelemetry-instrument",)


def _parse(raw: str) -> list[tuple[str, str]]:
    pairs = []
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs.append((key.strip(), value.strip()))
    return pairs


def otel_rollout_env(base: Mapping[str, str], ids: Mapping[str, str | int]) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` with the rollout ``ids`` (``semconv.ROLLOUT_ID`` ...) merged into the
    user's own from ``base`` (theirs kept, except the rollout keys, which are this rollout's), values
    percent-encoded as the OTel spec asks; ``OTEL_METRICS_EXPORTER`` and ``OTEL_LOGS_EXPORTER`` ``none``
    unless ``base`` sets them (the Trainer's collector takes traces only)."""
    ours = {key: urllib.parse.quote(str(value), safe="") for key, value in ids.items()}
    kept = [(k, v) for k, v in _parse(base.get("OTEL_RESOURCE_ATTRIBUTES", "")) if k not in ours]
    out = {"OTEL_RESOURCE_ATTRIBUTES": ",".join(f"{k}={v}" for k, v in [*kept, *ours.items()])}
    for name in _TRACES_ONLY:
        if not base.get(name, "").strip():
            out[name] = "none"
    return out


def agent_credentials(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` as an agent gets it: the collector's ingest token only (``SPANRL_COLLECTOR_INGEST_TOKEN``; the
    all-scope ``SPANRL_COLLECTOR_TOKEN`` stands in when no ingest token is set), every other token removed."""
    out = {k: v for k, v in base.items() if k not in _NOT_FOR_AGENTS}
    ingest = base.get(env.SPANRL_COLLECTOR_INGEST_TOKEN, "").strip() or base.get(env.SPANRL_COLLECTOR_TOKEN, "").strip()
    if ingest:
        out[env.SPANRL_COLLECTOR_INGEST_TOKEN] = ingest
    return out


def otlp_headers(environ: Mapping[str, str]) -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_HEADERS`` as the OTel SDK reads it (``k=v,...``, values percent-decoded), keys lower
    case as gRPC metadata needs them."""
    return {k.lower(): urllib.parse.unquote(v) for k, v in _parse(environ.get(_OTEL_HEADERS, ""))}


def ingest_token_env(token: str, base: Mapping[str, str]) -> dict[str, str]:
    """What hands an agent the collector's ingest ``token``: ``OTEL_EXPORTER_OTLP_HEADERS`` (any OTel SDK sends
    it; ``base``'s other headers kept) and ``SPANRL_COLLECTOR_INGEST_TOKEN`` (spanrl's instrumentation)."""
    headers = {k: v for k, v in otlp_headers(base).items() if k != "authorization"}
    headers["authorization"] = f"Bearer {token}"
    return {_OTEL_HEADERS: encode_otlp_headers(headers), env.SPANRL_COLLECTOR_INGEST_TOKEN: token}


def kept_ingest_header(user: Mapping[str, str], ours: Mapping[str, str]) -> dict[str, str]:
    """When both the user's environment and ``ours`` (`ingest_token_env`'s) set ``OTEL_EXPORTER_OTLP_HEADERS``:
    one value with the user's headers and ours (ours win), so the user's cannot drop the ingest token."""
    if _OTEL_HEADERS not in user or _OTEL_HEADERS not in ours:
        return {}
    return {_OTEL_HEADERS: encode_otlp_headers({**otlp_headers(user), **otlp_headers(ours)})}


def encode_otlp_headers(headers: Mapping[str, str]) -> str:
    """``headers`` as ``OTEL_EXPORTER_OTLP_HEADERS`` holds them (``k=v,...``, values percent-encoded)."""
    return ",".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in headers.items())


def agent_service_name(argv: Sequence[str]) -> str:
    """The service name of an agent started as ``argv``: its script's stem (``python -u agent.py`` ->
    ``agent``), its module (``python -m pkg.agent`` -> ``pkg.agent``), else the executable's name."""
    args = [str(a) for a in argv]
    while args and PurePath(args[0]).name in _LAUNCHERS:
        args = args[1:]
    if not args:
        return "agent"
    program = PurePath(args[0]).name
    if _INTERPRETER.fullmatch(program):
        rest = iter(args[1:])
        for arg in rest:
            if arg == "-m":
                return next(rest, program)
            if not arg.startswith("-"):
                return PurePath(arg).stem or program
            if arg == "-c":
                break
    return program


def agent_service_env(base: Mapping[str, str], argv: Sequence[str]) -> dict[str, str]:
    """``{"OTEL_SERVICE_NAME": agent_service_name(argv)}``, or ``{}`` when ``base`` names the service already
    (``OTEL_SERVICE_NAME``, or ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``)."""
    if base.get("OTEL_SERVICE_NAME", "").strip():
        return {}
    if any(k == "service.name" for k, _ in _parse(base.get("OTEL_RESOURCE_ATTRIBUTES", ""))):
        return {}
    return {"OTEL_SERVICE_NAME": agent_service_name(argv)}
