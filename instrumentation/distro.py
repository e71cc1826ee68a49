"""``opentelemetry_distro`` entry point ``spanrl``: defaults for ``opentelemetry-instrument``.

Selected when it is the only distro installed, or with ``OTEL_PYTHON_DISTRO=spanrl`` beside
``opentelemetry-distro`` (whose own defaults would also turn on OTLP metrics and logs).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from opentelemetry.instrumentation.distro import BaseDistro

from spanrl import env
from spanrl.instrumentation.config import apply_env_defaults, capture_profile

_logger = logging.getLogger(__name__)
_OPENAI_V2 = "opentelemetry.instrumentation.openai_v2"
_OPENLLMETRY = "opentelemetry.instrumentation.openai"
_CHOICES = {"openllmetry": (_OPENLLMETRY + ":", _OPENAI_V2), "openai-v2": (_OPENAI_V2, _OPENLLMETRY + ":")}
_DEFAULT_CHOICE = "openllmetry"


class SpanRLDistro(BaseDistro):
    """Sets spanrl's defaults for every standard variable the user left unset (see ``apply_env_defaults``).

    One OpenAI instrumentor only: when both are installed, the one ``SPANRL_OPENAI_INSTRUMENTOR`` names
    (default OpenLLMetry) is loaded and the other is not (both would record every call, and the second
    client span would count as a second call).
    """

    def _configure(self, **kwargs: Any) -> None:
        apply_env_defaults()

    def load_instrumentor(self, entry_point: Any, **kwargs: Any) -> None:
        value = getattr(entry_point, "value", "")
        choice = env.get_str(env.SPANRL_OPENAI_INSTRUMENTOR, _DEFAULT_CHOICE)
        if choice not in _CHOICES:
            _logger.warning("%s=%r is not one of %s; using %s", env.SPANRL_OPENAI_INSTRUMENTOR, choice,
                            ", ".join(_CHOICES), _DEFAULT_CHOICE)
            choice = _DEFAULT_CHOICE
        keep, drop = _CHOICES[choice]
        if value.startswith((_OPENLLMETRY + ":", _OPENAI_V2)) and capture_profile() == "lean":
            _logger.info("spanrl: %s not loaded (%s=lean: the policy server records the calls)", value,
                         env.SPANRL_CAPTURE)
            return
        if value.startswith(drop) and importlib.util.find_spec(keep.rstrip(":")) is not None:
            _logger.info("spanrl: %s not loaded, %s already traces OpenAI calls", value, choice)
            return
        super().load_instrumentor(entry_point, **kwargs)
