"""``opentelemetry_distro`` entry point ``spanrl``: defaults for ``opentelemetry-instrument``.

Selected when it is the only distro installed, or with ``OTEL_PYTHON_DISTRO=spanrl`` beside
``opentelemetry-distro`` (whose own defaults would also turn on OTLP metrics and logs).
"""

from __future__ import annotations

from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro

from spanrl.instrumentation.config import apply_env_defaults


class SpanRLDistro(BaseDistro):
    """Sets spanrl's defaults for every standard variable the user left unset (see ``apply_env_defaults``)."""

    def _configure(self, **kwargs: Any) -> None:
        apply_env_defaults()
