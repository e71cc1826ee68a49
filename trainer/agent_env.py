"""The environment of a command-line agent's rollout: beside ``SPANRL_*`` (for spanrl-aware agents), the
standard ``OTEL_RESOURCE_ATTRIBUTES`` carries the rollout ids, so that any OTel SDK, in any language,
puts them on every span with nothing spanrl-specific installed (docs/conventions.md, "Without spanrl in
the agent").

``OTEL_SERVICE_NAME`` is passed through when the user sets it, never invented: the Node.js SDK lets the
variable override a service name the agent sets in code."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

__all__ = ["otel_rollout_env"]

_TRACES_ONLY = ("OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER")


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
