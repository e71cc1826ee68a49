"""Defaults for `opentelemetry-instrument` and the programmatic config."""

from __future__ import annotations

import sys

import pytest

from spanrl.errors import ConfigError
from spanrl.instrumentation import InstrumentationConfig, default_config
from spanrl.instrumentation.config import apply_env_defaults


def test_env_defaults_on_empty_environment():
    environ: dict[str, str] = {}
    chosen = apply_env_defaults(environ)
    assert environ["OTEL_TRACES_EXPORTER"] == "spanrl"  # OTLP/gRPC with the fast encoder
    assert environ["OTEL_METRICS_EXPORTER"] == "none"
    assert environ["OTEL_LOGS_EXPORTER"] == "none"
    assert environ["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert environ["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4317"
    assert environ["OTEL_SERVICE_NAME"] == "spanrl-agent"
    assert environ["OTEL_BSP_SCHEDULE_DELAY"] == "500"
    assert environ["OTEL_BSP_MAX_QUEUE_SIZE"] == "8192"
    assert int(environ["OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT"]) >= 1 << 20
    assert environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] == "SPAN_ONLY"
    assert environ["TRACELOOP_TRACE_CONTENT"] == "true"
    assert chosen == environ
    assert apply_env_defaults(environ) == {}  # idempotent


def test_env_defaults_keep_what_the_user_set():
    environ = {
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317",
        "OTEL_RESOURCE_ATTRIBUTES": "service.name=my-agent,team=a",
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "100",
        "OTEL_SEMCONV_STABILITY_OPT_IN": "http",
        "TRACELOOP_TRACE_CONTENT": "false",
    }
    apply_env_defaults(environ)
    assert environ["OTEL_METRICS_EXPORTER"] == "otlp"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in environ
    assert "OTEL_SERVICE_NAME" not in environ
    assert "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT" not in environ
    assert environ["OTEL_SEMCONV_STABILITY_OPT_IN"] == "http"
    assert environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] == "true"  # old-style boolean
    assert environ["TRACELOOP_TRACE_CONTENT"] == "false"


def test_env_defaults_http_protocol_gets_http_port_and_token_header():
    environ = {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "SPANRL_COLLECTOR_TOKEN": "s3cret"}
    apply_env_defaults(environ)
    assert environ["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
    assert environ["OTEL_TRACES_EXPORTER"] == "otlp"
    assert environ["OTEL_EXPORTER_OTLP_HEADERS"] == "authorization=Bearer%20s3cret"


def test_default_config_validates_and_is_fresh():
    assert default_config().validate() == InstrumentationConfig()
    assert default_config() is not default_config()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"endpoint": " "}, "endpoint must be a URL"),
        ({"service_name": ""}, "service_name must be a non-empty string or None, got ''"),
        ({"schedule_delay_millis": 0}, "schedule_delay_millis must be a positive integer, got 0"),
        ({"max_queue_size": 1.5}, "max_queue_size must be a positive integer, got 1.5"),
        ({"export_timeout_millis": True}, "export_timeout_millis must be a positive integer, got True"),
        (
            {"max_queue_size": 10, "max_export_batch_size": 20},
            "max_export_batch_size must be less than or equal to max_queue_size, got 20 > 10",
        ),
    ],
)
def test_bad_config_names_the_field(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        InstrumentationConfig(**fields).validate()


def test_resolved_values_follow_precedence(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317")
    monkeypatch.setenv("SPANRL_COLLECTOR_TOKEN", "tok")
    assert InstrumentationConfig().resolved_endpoint() == "http://env:4317"
    assert InstrumentationConfig(endpoint="http://arg:1").resolved_endpoint() == "http://arg:1"
    assert InstrumentationConfig().resolved_headers() == {"authorization": "Bearer tok"}
    assert InstrumentationConfig(headers={"Authorization": "x"}).resolved_headers() == {"Authorization": "x"}

class _EntryPoint:
    """An entry point whose load() we control (no import, no global instrumentation in the test process)."""

    def __init__(self, value: str, loaded: list[str]) -> None:
        self.value = value
        self.loaded = loaded

    def load(self) -> type:
        loaded = self.loaded
        value = self.value

        class Recorder:
            def instrument(self, **kwargs: object) -> None:
                loaded.append(value)

        return Recorder


def test_distro_loads_one_openai_instrumentor_only():
    from spanrl.instrumentation.distro import SpanRLDistro

    loaded: list[str] = []
    distro = SpanRLDistro()
    for value in (
        "opentelemetry.instrumentation.openai_v2:OpenAIInstrumentor",  # skipped: OpenLLMetry is installed
        "opentelemetry.instrumentation.openai:OpenAIInstrumentor",
        "spanrl.instrumentation.instrumentor:SpanRLInstrumentor",
    ):
        distro.load_instrumentor(_EntryPoint(value, loaded), skip_dep_check=True)
    assert loaded == [
        "opentelemetry.instrumentation.openai:OpenAIInstrumentor",
        "spanrl.instrumentation.instrumentor:SpanRLInstrumentor",
    ]


def test_distro_keeps_the_openai_instrumentor_the_user_names(monkeypatch):
    import importlib.machinery
    import types

    from spanrl.instrumentation.distro import SpanRLDistro

    # openai-v2 present (as if installed beside OpenLLMetry, which the train extra brings)
    v2 = "opentelemetry.instrumentation.openai_v2"
    fake = types.ModuleType(v2)
    fake.__spec__ = importlib.machinery.ModuleSpec(v2, None)
    monkeypatch.setitem(sys.modules, v2, fake)
    values = ("opentelemetry.instrumentation.openai_v2:OpenAIInstrumentor",
              "opentelemetry.instrumentation.openai:OpenAIInstrumentor")

    def loaded_with(choice: str | None) -> list[str]:
        if choice is None:
            monkeypatch.delenv("SPANRL_OPENAI_INSTRUMENTOR", raising=False)
        else:
            monkeypatch.setenv("SPANRL_OPENAI_INSTRUMENTOR", choice)
        loaded: list[str] = []
        for value in values:
            SpanRLDistro().load_instrumentor(_EntryPoint(value, loaded), skip_dep_check=True)
        return [v.split(":")[0].rsplit(".", 1)[1] for v in loaded]

    assert loaded_with(None) == ["openai"]
    assert loaded_with("openllmetry") == ["openai"]
    assert loaded_with("openai-v2") == ["openai_v2"]
    assert loaded_with("both please") == ["openai"]  # a bad value: the default, with a warning
