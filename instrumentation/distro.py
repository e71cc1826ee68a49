"""``opentelemetry_distro`` entry point ``spanrl``: defaults for ``opentelemetry-instrument``.

Selected when it is the only distro installed, or with ``OTEL_PYTHON_DISTRO=spanrl`` beside
``opentelemetry-distro`` (whose own defaults would also turn on OTLP metrics and logs).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro

from spanrl.instrumentation.config import apply_env_defaults

_logger = logging.getLogger(__name__)
_OPENAI_V2 = "opentelemetry.instrumentation.openai_v2"
_OPENLLMETRY = "opentelemetry.instrumentation.openai"


class SpanRLDistro(BaseDistro):
    """Sets spanrl's defaults for every standard variable the user left unset (see ``apply_env_defaults``).

    One OpenAI instrumentor only: when OpenLLMetry is installed, the official ``-openai-v2`` one is not
    loaded (both would record every call, and the second client span would count as a second call).
    """

    def _configure(self, **kwargs: Any) -> None:
        apply_env_defaults()

    def load_instrumentor(self, entry_point: Any, **kwargs: Any) -> None:
        value = getattr(entry_point, "value", "")
        if value.startswith(_OPENAI_V2) and importlib.util.find_spec(_OPENLLMETRY) is not None:
            _logger.info("spanrl: %s not loaded, OpenLLMetry already traces OpenAI calls", value)
            return
        super().load_instrumentor(entry_point, **kwargs)
