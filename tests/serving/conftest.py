"""Fixtures of the policy server tests: a tiny model saved by the test session, and a server on it."""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spanrl.demo.tiny import build_tiny_model
from spanrl.serving import PolicyServer, ServerConfig

WORDS = [str(i) for i in range(100)] + ["add", "sub", "what", "is", "?", "the", "answer"]


def require_vllm() -> None:
    """Skip the calling test module unless vLLM imports: ``make test-vllm`` runs the vLLM modules in ``.venv-vllm``.
    In CI (``CI=true``) that venv failing to import vllm fails the module instead: a broken install is a failure
    there, not a row of skips."""
    venv = pathlib.Path(__file__).resolve().parents[2] / ".venv-vllm"
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # ImportError, or a broken build's own error (e.g. a CUDA-only torchvision)
        if os.environ.get("CI") == "true" and pathlib.Path(sys.prefix).resolve() == venv.resolve():
            pytest.fail(f"CI: .venv-vllm cannot import vllm: {type(exc).__name__}: {exc}", pytrace=False)
        pytest.skip(f"needs vLLM: `make test-vllm` runs this module in .venv-vllm ({type(exc).__name__}: {exc})",
                    allow_module_level=True)


@pytest.fixture(autouse=True)
def _one_torch_thread(one_torch_thread: None) -> None:
    """Every policy server test runs on one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", words=WORDS, seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir_other(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Same architecture and vocabulary, other weights (for reload tests)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny2") / "model", words=WORDS, seed=1)


class ServerWithSpans:
    """A running PolicyServer plus the in-memory exporter that receives its spans."""

    def __init__(self, server: PolicyServer, exporter: InMemorySpanExporter) -> None:
        self.server = server
        self.exporter = exporter

    def spans(self) -> list:
        self.server.force_flush()
        return list(self.exporter.get_finished_spans())


ADMIN_TOKEN = "reload-s3cret"
"""The admin token of the ``served`` server, whose checkpoint root is the session's temporary folder."""


@pytest.fixture
def served(tiny_model_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWithSpans]:
    exporter = InMemorySpanExporter()
    server = PolicyServer(
        ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                     max_batch_delay_ms=20.0, admin_token=ADMIN_TOKEN, checkpoint_root=tmp_path_factory.getbasetemp()),
        span_exporter=exporter,
    ).start()
    try:
        yield ServerWithSpans(server, exporter)
    finally:
        server.shutdown()
