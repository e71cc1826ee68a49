"""Fixtures for the agent-side tests: an in-memory span exporter on the global SDK provider."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spanrl.instrumentation._processor import attach_rollout_processor

TESTS_DIR = Path(__file__).resolve().parent.parent
if str(TESTS_DIR) not in sys.path:  # for `import fake_openai`
    sys.path.insert(0, str(TESTS_DIR))

_exporter = InMemorySpanExporter()


def _install() -> None:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
        provider = trace.get_tracer_provider()
    if not getattr(provider, "_spanrl_test_exporter", False):
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        provider._spanrl_test_exporter = True  # type: ignore[attr-defined]
    attach_rollout_processor(provider)


class Spans:
    """Finished spans recorded since the test started."""

    def all(self) -> list[ReadableSpan]:
        return list(_exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        found = self.named(name)
        assert len(found) == 1, f"expected one span {name!r}, got {[s.name for s in self.all()]}"
        return found[0]


@pytest.fixture
def spans() -> Iterator[Spans]:
    _install()
    _exporter.clear()
    yield Spans()
    _exporter.clear()


@pytest.fixture(params=["c", "python"])
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The span encoder of the export queue: the C one (instrumentation/_encode.c; not built: a failure in CI,
    a skip elsewhere) or, with it turned off, the Python reference."""
    from required import missing

    from spanrl.instrumentation import exporter

    if request.param == "python":
        monkeypatch.setattr(exporter, "_encode", None)
    elif exporter._encode is None:
        missing("the C extension spanrl.instrumentation._encode is not built; "
                "build it with `python setup.py build_ext --inplace`")
    return request.param
