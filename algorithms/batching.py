"""How an update cuts its batch into micro-batches, and what the CPU can do (bf16), for the
policy-gradient algorithms.

Padding is compute thrown away: a micro-batch is padded to its longest row, so rows of similar length
belong together. ``length_sorted_micro_batches`` sorts a mini-batch's rows by (prompt, completion)
length before cutting it into micro-batches of a fixed row count. The gradient is a sum over micro-batches, so the order changes
nothing but the padding (the row counts, and so TRL's per-micro-batch normalisation, stay as before).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["bf16_supported", "length_sorted_micro_batches", "padded_tokens", "update_autocast"]


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
