"""The environment of a command-line agent's rollout: ``SPANRL_*`` for spanrl-aware agents, and the
standard ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME`` so that any OTel SDK, in any language,
puts the rollout ids on every span with nothing spanrl-specific installed (docs/conventions.md,
"Without spanrl in the agent")."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

from spanrl import semconv

__all__ = ["DEFAULT_AGENT_SERVICE_NAME", "otel_rollout_env"]

_TRACES_ONLY = ("OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER")

DEFAULT_AGENT_SERVICE_NAME = "spanrl-agent"
"""``OTEL_SERVICE_NAME`` of an agent whose environment names none."""


def _parse(raw: str) -> list[tuple[str, str]]:
    pairs = []
    for item in raw.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs.append((key.strip(), value.strip()))
    return pairs


def otel_rollout_env(base: Mapping[str, str], ids: Mapping[str, str | int]) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` with the rollout ``ids`` (``semconv.ROLLOUT_ID`` ...) merged into the
    user's own (theirs kept, except the rollout keys, which are this rollout's), values percent-encoded
    as the spec asks; ``OTEL_SERVICE_NAME`` unless ``base`` sets it; ``OTEL_METRICS_EXPORTER`` and
    ``OTEL_LOGS_EXPORTER`` ``none`` unless set (the collector takes traces only)."""
    ours = {key: urllib.parse.quote(str(value), safe="") for key, value in ids.items()}
    kept = [(k, v) for k, v in _parse(base.get("OTEL_RESOURCE_ATTRIBUTES", "")) if k not in ours]
    merged = ",".join(f"{k}={v}" for k, v in [*kept, *ours.items()])
    out = {"OTEL_RESOURCE_ATTRIBUTES": merged}
    for name in _TRACES_ONLY:  # the Trainer's collector takes traces only: no metric/log export errors
        if not base.get(name, "").strip():
            out[name] = "none"
    if not base.get("OTEL_SERVICE_NAME", "").strip():
        service = dict(kept).get(semconv.SERVICE_NAME)
        out["OTEL_SERVICE_NAME"] = urllib.parse.unquote(service) if service else DEFAULT_AGENT_SERVICE_NAME
    return out
