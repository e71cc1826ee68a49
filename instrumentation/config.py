"""Configuration of the agent side: SDK defaults for ``opentelemetry-instrument`` and for ``configure()``.

``apply_env_defaults()`` fills in standard ``OTEL_*`` variables only where the user set nothing, so an
agent run as ``opentelemetry-instrument python agent.py`` exports its traces to a local spanrl collector
with message content captured and nothing truncated. ``InstrumentationConfig`` is the typed config of
the programmatic ``configure()``.

Imports nothing but the standard library.
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from spanrl import env
from spanrl.errors import ConfigError, positive_int

_logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "spanrl-agent"
DEFAULT_GRPC_ENDPOINT = f"http://{env.DEFAULT_HOST}:{env.DEFAULT_GRPC_PORT}"
DEFAULT_HTTP_ENDPOINT = f"http://{env.DEFAULT_HOST}:{env.DEFAULT_HTTP_PORT}"
# A short-lived agent must not wait 5 s (the SDK default) before its spans leave; the SDK flushes at exit.
DEFAULT_SCHEDULE_DELAY_MILLIS = 500
DEFAULT_MAX_QUEUE_SIZE = 8192
DEFAULT_MAX_EXPORT_BATCH_SIZE = 512
DEFAULT_EXPORT_TIMEOUT_MILLIS = 10_000
# Messages must arrive whole; this bound only stops a runaway string (4 Mi characters).
DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT = 4 * 1024 * 1024
GEN_AI_OPT_IN = "gen_ai_latest_experimental"

# Standard variable names (opentelemetry-sdk / -instrumentation / OpenLLMetry), not redeclared elsewhere.
_OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
_OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
_OTEL_LOGS_EXPORTER = "OTEL_LOGS_EXPORTER"
_OTEL_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
_OTEL_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
_OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
_OTEL_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
_OTEL_HEADERS = "OTEL_EXPORTER_OTLP_HEADERS"
_OTEL_TRACES_HEADERS = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
_OTEL_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"
_OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
_OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
_OTEL_BSP_SCHEDULE_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
_OTEL_BSP_MAX_QUEUE_SIZE = "OTEL_BSP_MAX_QUEUE_SIZE"
_OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"
_OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT = "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"
_OTEL_SEMCONV_STABILITY_OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
_OTEL_GENAI_CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
_TRACELOOP_TRACE_CONTENT = "TRACELOOP_TRACE_CONTENT"
_TRACELOOP_METRICS_ENABLED = "TRACELOOP_METRICS_ENABLED"


CAPTURE_PROFILES = ("full", "lean")
DEFAULT_CAPTURE = "full"


def capture_profile() -> str:
    """``SPANRL_CAPTURE`` (``full`` or ``lean``); an unknown value is logged and ``full`` is used."""
    value = env.get_str(env.SPANRL_CAPTURE, DEFAULT_CAPTURE).strip().lower()
    if value not in CAPTURE_PROFILES:
        _logger.warning("%s=%r is not one of %s; using %s", env.SPANRL_CAPTURE, value, ", ".join(CAPTURE_PROFILES),
                        DEFAULT_CAPTURE)
        return DEFAULT_CAPTURE
    return value


def _is_set(environ: MutableMapping[str, str], *names: str) -> bool:
    return any(environ.get(name, "").strip() for name in names)


def apply_env_defaults(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set spanrl's defaults for the standard variables the user left unset; return what was set.

    Traces over OTLP/gRPC to 127.0.0.1:4317 with spanrl's exporter (the standard OTLP exporter and port
    4318 when the user chose an HTTP protocol), a service name,
    metrics and logs off, GenAI message content captured (OpenLLMetry and the official openai-v2
    instrumentation), a 500 ms batch delay, an 8192-span queue and an attribute length limit that keeps
    messages whole.
    ``SPANRL_COLLECTOR_INGEST_TOKEN`` (else ``SPANRL_COLLECTOR_TOKEN``) becomes the bearer ``authorization``
    header unless headers are set.
    Idempotent: a second call sets nothing.
    """
    environ = os.environ if environ is None else environ
    chosen: dict[str, str] = {}

    def default(name: str, value: str, *also: str) -> None:
        if not _is_set(environ, name, *also):
            environ[name] = value
            chosen[name] = value

    default(_OTEL_PROTOCOL, "grpc", _OTEL_TRACES_PROTOCOL)
    protocol = (environ.get(_OTEL_TRACES_PROTOCOL) or environ.get(_OTEL_PROTOCOL) or "grpc").strip()
    # `spanrl`: the SDK's OTLP/gRPC exporter with a faster encoder (exporter.py); HTTP: the standard one.
    default(_OTEL_TRACES_EXPORTER, "spanrl" if protocol == "grpc" else "otlp")
    default(_OTEL_METRICS_EXPORTER, "none")
    default(_OTEL_LOGS_EXPORTER, "none")
    endpoint = DEFAULT_GRPC_ENDPOINT if protocol == "grpc" else DEFAULT_HTTP_ENDPOINT
    default(_OTEL_ENDPOINT, endpoint, _OTEL_TRACES_ENDPOINT)
    if "service.name=" not in environ.get(_OTEL_RESOURCE_ATTRIBUTES, ""):
        default(_OTEL_SERVICE_NAME, DEFAULT_SERVICE_NAME)
    default(_OTEL_BSP_SCHEDULE_DELAY, str(DEFAULT_SCHEDULE_DELAY_MILLIS))
    default(_OTEL_BSP_MAX_QUEUE_SIZE, str(DEFAULT_MAX_QUEUE_SIZE))  # as configure(): the SDK's 2048 drops bursts
    default(
        _OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT,
        str(DEFAULT_ATTRIBUTE_VALUE_LENGTH_LIMIT),
        _OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT,
    )
    default(_OTEL_SEMCONV_STABILITY_OPT_IN, GEN_AI_OPT_IN)
    latest = GEN_AI_OPT_IN in environ.get(_OTEL_SEMCONV_STABILITY_OPT_IN, "")
    default(_OTEL_GENAI_CAPTURE_CONTENT, "SPAN_ONLY" if latest else "true")
    default(_TRACELOOP_TRACE_CONTENT, "true")
    default(_TRACELOOP_METRICS_ENABLED, "false")
    token = (environ.get(env.SPANRL_COLLECTOR_INGEST_TOKEN, "") or environ.get(env.SPANRL_COLLECTOR_TOKEN, "")).strip()
    if token:
        default(_OTEL_HEADERS, f"authorization=Bearer%20{token}", _OTEL_TRACES_HEADERS)
    if chosen:
        _logger.debug("spanrl defaults for unset variables: %s", sorted(chosen))
    return chosen


@dataclass
class InstrumentationConfig:
    """Config of ``spanrl.instrumentation.configure()``: where and how an agent process exports spans."""

    endpoint: str | None = None
    """OTLP/gRPC endpoint. None: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_ENDPOINT``,
    then ``http://127.0.0.1:4317``."""
    service_name: str | None = None
    """Resource ``service.name``. None: ``OTEL_SERVICE_NAME``, then ``spanrl-agent``."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra gRPC metadata on every export (e.g. ``authorization``); ``SPANRL_COLLECTOR_INGEST_TOKEN``
    (else ``SPANRL_COLLECTOR_TOKEN``) adds a bearer token when this has no ``authorization`` key."""

    schedule_delay_millis: int = DEFAULT_SCHEDULE_DELAY_MILLIS
    """Longest time a finished span waits in the batch queue before export, in milliseconds."""
    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    """Spans buffered in the agent; beyond it new spans are dropped (counted, never blocking)."""
    max_export_batch_size: int = DEFAULT_MAX_EXPORT_BATCH_SIZE
    """Spans per OTLP export request."""
    export_timeout_millis: int = DEFAULT_EXPORT_TIMEOUT_MILLIS
    """Deadline of one export (with its retries), in milliseconds."""

    def validate(self) -> InstrumentationConfig:
        """Raise ``ConfigError`` naming the first bad field; return self."""
        if self.endpoint is not None and not self.endpoint.strip():
            raise ConfigError("endpoint must be a URL like http://127.0.0.1:4317 or None, got ''")
        if self.service_name is not None and not self.service_name.strip():
            raise ConfigError("service_name must be a non-empty string or None, got ''")
        for name in ("schedule_delay_millis", "max_queue_size", "max_export_batch_size", "export_timeout_millis"):
            positive_int(name, getattr(self, name))
        if self.max_export_batch_size > self.max_queue_size:
            raise ConfigError(
                f"max_export_batch_size must be less than or equal to max_queue_size, "
                f"got {self.max_export_batch_size} > {self.max_queue_size}"
            )
        return self

    def resolved_endpoint(self) -> str:
        """The endpoint after precedence: argument, environment, default."""
        return (
            self.endpoint
            or env.get_str(_OTEL_TRACES_ENDPOINT)
            or env.get_str(_OTEL_ENDPOINT)
            or DEFAULT_GRPC_ENDPOINT
        )

    def resolved_service_name(self) -> str:
        return self.service_name or env.get_str(_OTEL_SERVICE_NAME) or DEFAULT_SERVICE_NAME

    def resolved_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        token = env.get_str(env.SPANRL_COLLECTOR_INGEST_TOKEN) or env.get_str(env.SPANRL_COLLECTOR_TOKEN)
        if token and not any(k.lower() == "authorization" for k in headers):
            headers["authorization"] = f"Bearer {token}"
        return headers


def default_config() -> InstrumentationConfig:
    """A new default config."""
    return InstrumentationConfig()
