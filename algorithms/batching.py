"""How an update cuts its batch into micro-batches, what the CPU can do (bf16), and where the LM head
runs, for the policy-gradient algorithms.

Padding is compute thrown away: a micro-batch is padded to its longest row, so rows of similar length
belong together. ``length_sorted_micro_batches`` sorts a mini-batch's rows by (prompt, completion)
length before cutting it into micro-batches of a fixed row count. The gradient is a sum over micro-batches, so the order changes
nothing but the padding (the row counts, and so TRL's per-micro-batch normalisation, stay as before).

``completion_logprobs`` projects the LM head (49k columns on SmolLM2) only at real completion positions.
TRL 1.16's fused head does that on CUDA but projects every position elsewhere (prompt and padding
included, twice: its backward recomputes the logits); on CPU that was most of a short-answer update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "bf16_supported", "completion_logprobs", "length_sorted_micro_batches", "padded_tokens", "plain_lm_head",
    "update_autocast",
]

_VOCAB_CHUNK = 32768
"""Vocabulary columns per LM-head tile (TRL's chunk size)."""


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """Whether bf16 matmuls are fast here: a CUDA device with bf16, or a CPU with AVX512-BF16 or AMX."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def update_autocast(enabled: bool, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager:
    """bf16 autocast for a forward/backward when ``enabled``, else a context that does nothing."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def length_sorted_micro_batches(
    rows: torch.Tensor, prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, micro: int, *, sort: bool = True
) -> Iterator[torch.Tensor]:
    """``rows`` (indices) in micro-batches of ``micro`` rows; when ``sort``, longest prompt first, then
    longest completion (lengths indexed by row index).

    A micro-batch is padded to its longest prompt plus its longest completion (prompts left-padded,
    completions right-padded, as TRL lays them out), so sorting on the pair beats sorting on the total:
    a GRPO group's rollouts share one prompt and stay together, their completions sorted."""
    if sort:
        key = prompt_lengths[rows] * (int(completion_lengths.max()) + 1) + completion_lengths[rows]
        rows = rows[torch.argsort(key, descending=True, stable=True)]
    for start in range(0, len(rows), micro):
        yield rows[start : start + micro]


def padded_tokens(prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, batches: list[torch.Tensor]) -> int:
    """Positions a forward computes over ``batches`` (each padded to its longest prompt and completion)."""
    return sum(len(b) * int(prompt_lengths[b].max() + completion_lengths[b].max()) for b in batches if len(b))


def plain_lm_head(model: Any) -> bool:
    """Whether ``completion_logprobs`` computes ``model``'s log-probs exactly: a plain (or PEFT-wrapped)
    transformers model, unsharded, whose logits are the head's plain projection (soft-capping, scaling,
    FSDP wrappers and sharded DTensor weights are left to TRL's own path)."""
    from transformers import PreTrainedModel

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not isinstance(lm, PreTrainedModel) or type(lm.get_output_embeddings().weight.data) is not torch.Tensor:
        return False
    config = lm.config.get_text_config()
    scaled = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")
    return not any(getattr(config, name, None) is not None for name in scaled)


def completion_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, *,
    temperature: float, fp32_head: bool, entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` tokens, zero where masked.

    The backbone runs over every position; the LM head only over completion positions whose token is
    attended (TRL's chunked log-prob kernel: no (N, vocab) logits kept). ``model`` is a causal LM or a
    PEFT model around one. ``fp32_head``: project in fp32 outside autocast (the ratio to the server's
    fp32 log-probs is then not bf16 rounding)."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = lm.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    hidden = hidden[:, -logits_to_keep - 1 : -1]  # position t predicts token t + 1
    targets = input_ids[:, -logits_to_keep:]
    mask = attention_mask[:, -logits_to_keep:].bool()
    head = lm.get_output_embeddings()
    rows = hidden[mask]
    context: contextlib.AbstractContextManager = contextlib.nullcontext()
    if fp32_head:
        rows, context = rows.float(), torch.autocast(rows.device.type, enabled=False)
    outputs = ("log_probs", "entropy") if entropy else ("log_probs",)
    with context:
        logps, ent, *_ = ChunkedLogProbFunction.apply(
            rows, head.weight, head.bias, targets[mask], temperature, _VOCAB_CHUNK, None, 1.0, outputs
        )
    scatter = lambda x: x.new_zeros(mask.shape).masked_scatter(mask, x)  # noqa: E731
    return scatter(logps), (scatter(ent) if ent is not None else None)
