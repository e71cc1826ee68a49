"""Each framework's own small virtual environment: pinned packages, never spanrl (known upstream traps
are noted beside the pins)."""

from __future__ import annotations

_OTEL = ["opentelemetry-distro==0.66b2", "opentelemetry-exporter-otlp-proto-grpc==1.45.2"]

FRAMEWORKS: dict[str, list[str]] = {
    # openai-v2 2.4b0 with openai 3.57 needs httpx and opentelemetry-util-genai==1.1b0
    "openai_v2": [*_OTEL, "opentelemetry-instrumentation-openai-v2==2.4b0", "opentelemetry-util-genai==1.1b0",
                  "openai==3.57.0", "httpx"],
    "openllmetry_async_stream": [*_OTEL, "opentelemetry-instrumentation-openai==0.62.4", "openai==3.57.0"],
    "handmade_spans": [*_OTEL, "httpx"],
}
"""Framework name -> pip requirements of its venv (tests/frameworks/agents/<name>.py is its agent)."""
