"""How much memory a run's update and its server need on one device, before anything is loaded.

``spanrl train CONFIG --plan`` prints it, and ``spanrl train`` refuses a plan that cannot fit before it starts
(one process's plan: not under ``accelerate launch``; the Python ``Trainer`` does not check)::

    weights      params x 4 B          the policy is trained in fp32 (autocast runs the matmuls in bf16)
    gradients    trainable x 4 B       all params, or LoRA's adapters alone
    optimizer    trainable x 8 B       AdamW's two moments
    reference    params x 4 B          beta > 0 without LoRA (with LoRA, the base with adapters off)
    critic       params x 16 B         PPO: a trainable copy of the backbone with its AdamW state; with LoRA
                                       a frozen copy (params x 4 B) and its adapters' trainable x 16 B
    activations  tokens x layers x a   what autograd keeps for the backward, per micro-batch; with
                                       gradient checkpointing only each layer's input (h x 4 B) plus one layer
    log-probs    completion tokens x vocab x 4 B x 2   the LM head's fp32 logits and log-softmax (only
                                       completion positions are projected: ``batching.completion_logprobs``)
    serving      the embedded server's own copy of the weights in its dtype, or vLLM's reservation
                 (``serving.gpu_memory_utilization`` x the device's memory on a GPU, its KV space on CPU)
    runtime      the process itself: torch, transformers and TRL imported (CPU), or the CUDA context

``a``, the bytes autograd keeps per token and layer, is the Llama-shaped block's: its inputs to the two
norms and the residual (fp32), q, k, v and the attention output, the MLP's gate, up and activated
products (in the autocast dtype). Measured against ``ru_maxrss`` on CPU in ``docs/measurements.md``
("Memory plan"). Every count comes from the model's ``config.json`` through a model built on the
``meta`` device: no weights are read.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError

__all__ = ["MemoryPlan", "plan_memory", "device_capacity_bytes"]

_GIB = 1024**3
_CPU_RUNTIME_BYTES = 700 * 1024**2  # torch + transformers + TRL + DuckDB imported, measured (measurements.md)
_CUDA_RUNTIME_BYTES = 600 * 1024**2  # the CUDA context and cuBLAS workspaces
_VLLM_CPU_KV_BYTES = 1 * _GIB  # serving/vllm_backend.py's VLLM_CPU_KVCACHE_SPACE default
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 4}

# which knob lowers each part (what the refusal names)
_KNOBS = {
    "activations": "algorithm.micro_batch_size (fewer rows per forward)",
    "log-probs": "algorithm.micro_batch_size or algorithm.max_completion_length",
    "optimizer": "algorithm.lora (train adapters, not every weight)",
    "gradients": "algorithm.lora",
    "weights": "a smaller model",
    "reference": "algorithm.beta: 0 or algorithm.lora (the reference is then the base, free)",
    "critic": "algorithm.lora (the critic then trains adapters too) or GRPO (no critic)",
    "serving": "serving.gpu_memory_utilization (vLLM) or serving.dtype: bfloat16",
    "runtime": "nothing: this is the process itself",
}


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Estimated peak bytes per part on one device, and whether they fit."""

    device: str
    """``cpu`` or ``cuda``."""
    parts: dict[str, int]
    """Part name -> bytes (the module docstring says what each one counts)."""
    capacity: int | None
    """The device's memory in bytes; None when unknown (no refusal then)."""
    params: int
    """Parameters of the policy."""
    trainable: int
    """Parameters the optimizer updates."""
    knobs: dict[str, str] = dataclasses.field(default_factory=lambda: dict(_KNOBS))
    """Part name -> the settings that lower it (what :meth:`check` names)."""

    @property
    def total(self) -> int:
        """The estimated peak: every part at once (the update runs while the server holds its copy)."""
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        """Whether the total fits the device (True when the capacity is unknown)."""
        return self.capacity is None or self.total <= self.capacity

    def lines(self) -> list[str]:
        """What ``--plan`` prints: one line per part, the total and the verdict."""
        out = [f"memory plan on {self.device}: {self.params / 1e6:.1f}M parameters, "
               f"{self.trainable / 1e6:.2f}M trainable"]
        out += [f"  {name:<12} {_gib(size):>8.2f} GiB" for name, size in self.parts.items()]
        cap = "unknown" if self.capacity is None else f"{_gib(self.capacity):.2f} GiB"
        out.append(f"  {'total':<12} {_gib(self.total):>8.2f} GiB of {cap}: {'fits' if self.fits else 'does NOT fit'}")
        return out

    def check(self) -> None:
        """Raise :class:`ConfigError` naming the largest part and the knob that lowers it when it cannot fit."""
        if self.fits:
            return
        name = max((n for n in self.parts if n != "runtime"), key=self.parts.__getitem__)
        raise ConfigError(
            f"memory plan: an estimated {_gib(self.total):.1f} GiB peak does not fit the {self.device}'s "
            f"{_gib(self.capacity or 0):.1f} GiB; the largest part is {name} ({_gib(self.parts[name]):.1f} GiB): "
            f"lower it with {self.knobs[name]} (`spanrl train CONFIG --plan` prints every part)")


def _gib(size: int) -> float:
    return size / _GIB


def device_capacity_bytes(device: str) -> int | None:
    """Total memory of ``device`` (``cpu``: physical RAM; ``cuda``: the first GPU), None when unknown."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def _model_counts(model_dir: Path, lora: Any) -> dict[str, int]:
    """Parameters, trainable parameters and the shape numbers, from a model built on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    trainable = params
    if lora is not None:
        targets = lora.target_modules
        trainable = 0
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or name.endswith("lm_head"):
                continue
            if targets == "all-linear" or name.rsplit(".", 1)[-1] in targets:
                trainable += lora.r * (module.in_features + module.out_features)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(text.hidden_size)
    return {"params": params, "trainable": trainable, "hidden": hidden, "layers": int(text.num_hidden_layers),
            "ffn": int(getattr(text, "intermediate_size", 4 * hidden) or 4 * hidden),
            "vocab": int(text.vocab_size)}


def plan_memory(model_dir: str | Path, algorithm_config: Any, *, device: str = "cpu", rows: int,
                prompt_tokens: int, completion_tokens: int | None = None, serving_backend: str = "transformers",
                serving_dtype: str = "float32",
                embedded_server: bool = True, gpu_memory_utilization: float = 0.85,
                capacity: int | None = None) -> MemoryPlan:
    """The plan for one update of ``rows`` transitions (prompts of ``prompt_tokens``, completions of
    ``completion_tokens``, default the config's ``max_completion_length``) of ``algorithm_config``
    (GRPOConfig, PPOConfig, ...) on ``device``.

    ``capacity`` overrides the device's memory (default: :func:`device_capacity_bytes`)."""
    cfg = algorithm_config
    if rows < 1 or prompt_tokens < 0:
        raise ConfigError(f"memory plan: rows must be >= 1 and prompt_tokens >= 0, got {rows!r}, {prompt_tokens!r}")
    lora = getattr(cfg, "lora", None)
    n = _model_counts(Path(model_dir), lora)
    completion = completion_tokens or int(getattr(cfg, "max_completion_length", 256))
    micro = min(rows, getattr(cfg, "micro_batch_size", None) or getattr(cfg, "mini_batch_size", None) or rows)
    tokens = micro * (prompt_tokens + completion)
    autocast_bytes = 2 if getattr(cfg, "bf16", None) is not False else 4
    hidden, layers = n["hidden"], n["layers"]
    per_token_layer = 3 * hidden * 4 + (4 * hidden + 3 * n["ffn"]) * autocast_bytes
    if getattr(cfg, "gradient_checkpointing", False):
        activations = tokens * (layers * hidden * 4 + per_token_layer)
    else:
        activations = tokens * layers * per_token_layer
    parts = {
        "weights": n["params"] * 4,
        "gradients": n["trainable"] * 4,
        "optimizer": n["trainable"] * 8,
        "activations": activations,
        "log-probs": micro * completion * n["vocab"] * 4 * 2,
    }
    if getattr(cfg, "beta", 0.0) > 0 and lora is None:
        parts["reference"] = n["params"] * 4
    if hasattr(cfg, "critic_learning_rate"):  # PPO: a trainable backbone copy with its own AdamW state
        parts["critic"] = n["params"] * 16 if lora is None else n["params"] * 4 + n["trainable"] * 16
    capacity = capacity if capacity is not None else device_capacity_bytes(device)
    if embedded_server:
        if serving_backend == "vllm" and device.startswith("cuda"):
            parts["serving"] = int(gpu_memory_utilization * (capacity or 0))
        else:
            kv = _VLLM_CPU_KV_BYTES if serving_backend == "vllm" else 0
            parts["serving"] = n["params"] * _DTYPE_BYTES.get(serving_dtype, 4) + kv
    parts["runtime"] = _CUDA_RUNTIME_BYTES if device.startswith("cuda") else _CPU_RUNTIME_BYTES
    knobs = dict(_KNOBS)
    if hasattr(cfg, "gradient_checkpointing") and not cfg.gradient_checkpointing:
        knobs["activations"] += " or algorithm.gradient_checkpointing: true"
    return MemoryPlan(device=device, parts=parts, capacity=capacity, params=n["params"], trainable=n["trainable"],
                      knobs=knobs)
