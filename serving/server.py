"""PolicyServer: the model, its batcher, the HTTP app and the span exporter, started and stopped
together; usable in-process (the trainer) or as ``spanrl serve``."""

from __future__ import annotations

import contextlib
import copy
import logging
import signal
from collections.abc import Iterator
from typing import Any

from spanrl import semconv
from spanrl.errors import ServingError
from spanrl.http_server import ThreadedServer, bind, url_host
from spanrl.lifecycle import Lifecycle
from spanrl.serving.backend import Backend, GenerationRequest, GenerationResult, SamplingParams
from spanrl.serving.batcher import Batcher
from spanrl.serving.config import ServerConfig
from spanrl.serving.telemetry import SpanRecorder

__all__ = ["PolicyServer"]

_logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 30.0


def _load_backend(config: ServerConfig) -> Backend:
    from spanrl.serving.models import resolve_model

    model_dir = resolve_model(config.model)
    if config.torch_threads is not None:
        import torch

        torch.set_num_threads(config.torch_threads)
    if config.backend == "vllm":
        from spanrl.serving.vllm_backend import VLLMBackend

        return VLLMBackend(model_dir, dtype=config.dtype, max_context_tokens=config.max_context_tokens,
                           seed=config.seed, adapters=dict(config.lora_modules),
                           gpu_memory_utilization=config.gpu_memory_utilization, max_loras=config.max_loras,
                           max_lora_rank=config.max_lora_rank, enable_sleep_mode=config.enable_sleep_mode)
    from spanrl.serving.hf_backend import TransformersBackend

    return TransformersBackend(
        model_dir, device=config.device, dtype=config.dtype, max_context_tokens=config.max_context_tokens,
        seed=config.seed, adapters=dict(config.lora_modules),
        enable_prefix_caching=config.enable_prefix_caching, prefix_cache_bytes=config.prefix_cache_bytes,
    )


class PolicyServer:
    """An OpenAI-compatible server for the policy under training.

    ``start()`` loads the model and serves HTTP from a background thread; ``base_url`` is then
    ``http://HOST:PORT`` and rollouts use ``f"{base_url}/rollouts/{rollout_id}/v1"`` as their
    ``OPENAI_BASE_URL``. ``reload(...)`` swaps weights between batches and returns the new version.
    ``span_exporter`` replaces the OTLP exporter (e.g. an in-memory one in tests).
    """

    def __init__(self, config: ServerConfig, *, span_exporter: Any = None) -> None:
        self.config = config.validate()
        self._span_exporter = span_exporter
        self._server: ThreadedServer | None = None
        self._state: Any = None
        self._app_obj: Any = None
        self._life = Lifecycle("policy server", ServingError)

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> PolicyServer:
        """Load the model, start the batcher and serve HTTP in a background thread; return self."""
        if not self._life.begin(again=True):
            return self
        self._prepare()
        try:
            sock = bind(self.config.host, self.config.port)
        except OSError as exc:
            self.shutdown()
            raise ServingError(f"port: cannot bind {self.config.host}:{self.config.port}: {exc}") from exc
        self._server = ThreadedServer(self._app(), sock, name="spanrl-policy-http")
        if not self._server.start(_START_TIMEOUT_S):
            self.shutdown()
            raise ServingError(f"the HTTP server did not start on {self.config.host}:{self.port}")
        _logger.info("policy server %r at %s", self.config.model_name, self.base_url)
        return self

    def serve_forever(self) -> None:
        """Serve in the calling (main) thread until SIGINT / SIGTERM, then shut down cleanly: queued
        generations finish and spans are flushed before this returns (``spanrl serve``)."""
        import uvicorn

        self._life.begin()

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # ours below; uvicorn's re-raises the signal
                yield

        self._prepare()
        server = _Server(
            uvicorn.Config(self._app(), host=self.config.host, port=self.config.port, log_level="info", lifespan="off",
                           access_log=not self.config.disable_uvicorn_access_log)
        )

        def stop(signum: int, frame: object) -> None:
            server.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            server.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.shutdown()

    def shutdown(self) -> None:
        """Stop HTTP, finish queued generations, flush spans. Safe before start and twice."""
        if not self._life.end():
            return
        if self._server is not None:
            self._server.shutdown(_STOP_TIMEOUT_S)
        self._stop_parts()

    def __enter__(self) -> PolicyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # --- what callers use -------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The bound port (the real one when the config asked for 0)."""
        return self._server.port if self._server is not None else self.config.port

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT`` (without ``/v1``)."""
        return f"http://{url_host(self.config.host)}:{self.port}"

    def rollout_base_url(self, rollout_id: str, attempt: int | None = None) -> str:
        """The ``OPENAI_BASE_URL`` that attributes a rollout's requests to it."""
        return semconv.rollout_base_url(self.base_url, rollout_id, attempt)

    @property
    def version(self) -> int:
        """Policy version of the base model: 0 at start, +1 per reload."""
        return self._require_state().batcher.version

    @property
    def adapters(self) -> dict[str, int]:
        """The LoRA adapters served, name -> policy version (0 at start or when added, +1 per reload of it)."""
        return self._require_state().batcher.adapters

    @property
    def tokenizer(self) -> Any:
        """The served model's tokenizer."""
        return self._require_state().tokenizer

    def reload(self, source: Any, timeout: float | None = None, *, adapter: str | None = None) -> int:
        """Swap in new weights (folder path, ``state_dict`` or ``torch.nn.Module``, copied) after the
        batch in flight; requests keep being served. Returns the new version. Thread-safe. With
        ``adapter``: that LoRA adapter's weights (a PEFT adapter folder, PEFT model or adapter state_dict;
        added when new), bumping only its version."""
        return self._require_state().batcher.reload(source, timeout, adapter=adapter)

    def sleep(self, timeout: float | None = None) -> bool:
        """Free the backend's GPU memory until the next generation or reload wakes it (vLLM's sleep mode), after
        the batch in flight; False (nothing done) unless ``ServerConfig.enable_sleep_mode``."""
        state = self._require_state()
        if not self.config.enable_sleep_mode:
            return False
        state.batcher.call(state.batcher.backend.sleep).result(timeout)
        return True

    def generate(self, prompt_ids: list[int], params: SamplingParams, *, n: int = 1,
                 adapter: str | None = None) -> GenerationResult:
        """Generate in-process through the same batcher the HTTP routes use (no span is recorded)."""
        request = GenerationRequest(list(prompt_ids), params, n=n, adapter=adapter)
        return self._require_state().batcher.submit(request).result()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every finished span now."""
        return self._require_state().recorder.force_flush(timeout_millis)

    # --- internals --------------------------------------------------------------------------------
    def _prepare(self) -> None:
        from spanrl.serving.app import ServerState

        if self._state is not None:
            return
        if not self.config.api_keys:  # validate() refused this beyond loopback
            _logger.warning("policy server: no API keys (--api-key-file): every client on this machine may name any "
                            "rollout, conversation or trace; keyless serving is allowed on loopback only")
        backend = _load_backend(self.config)
        batcher = Batcher(
            backend,
            max_batch_size=self.config.max_batch_size,
            max_batch_delay_ms=self.config.max_batch_delay_ms,
            max_queue_size=self.config.max_queue_size,
        )
        recorder = SpanRecorder(
            service_name=self.config.service_name,
            endpoint=self.config.otlp_endpoint,
            headers=self.config.otlp_headers,
            exporter=self._span_exporter,
            compact=self.config.compact_token_arrays,
        )
        batcher.start()
        # The HTTP side gets its own tokenizer copy: a Rust tokenizer shared across threads can fail with
        # "Already borrowed" when one thread changes its settings while another encodes.
        http_tokenizer = copy.deepcopy(backend.tokenizer)
        self._state = ServerState(self.config, batcher, http_tokenizer, backend.max_context_tokens, recorder)

    def _app(self) -> Any:
        from spanrl.serving.app import build_app

        self._app_obj = build_app(self._state)
        return self._app_obj

    def _stop_parts(self) -> None:
        state, self._state = self._state, None
        if self._app_obj is not None:
            self._app_obj.state.tokenizer_pool.shutdown()
        if state is None:
            return
        state.batcher.shutdown(_STOP_TIMEOUT_S)
        state.batcher.backend.close()
        state.recorder.shutdown()

    def _require_state(self) -> Any:
        if self._state is None:
            raise ServingError("The policy server is not running: call start() first (or it has been shut down).")
        return self._state
