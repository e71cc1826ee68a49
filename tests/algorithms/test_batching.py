"""Micro-batches cut by length, and the bf16 switch, for the policy-gradient updates."""

from __future__ import annotations

import torch

from spanrl.algorithms.batching import bf16_supported, length_sorted_micro_batches, padded_tokens, update_autocast


def test_length_sorting_keeps_every_row_once_and_cuts_padding() -> None:
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(20, 300, (4,), generator=gen).repeat_interleave(8)  # GRPO groups share a prompt
    completion = torch.randint(5, 120, (32,), generator=gen)
    rows = torch.randperm(32, generator=gen)
    sorted_batches = list(length_sorted_micro_batches(rows, prompt, completion, 4))
    random_batches = list(length_sorted_micro_batches(rows, prompt, completion, 4, sort=False))
    assert sorted(torch.cat(sorted_batches).tolist()) == list(range(32))
    assert [len(b) for b in sorted_batches] == [4] * 8  # same row counts: TRL's normalisation is unchanged
    real = int((prompt + completion).sum())
    assert all(len(set(prompt[b].tolist())) == 1 for b in sorted_batches)  # a group stays together
    assert padded_tokens(prompt, completion, sorted_batches) < padded_tokens(prompt, completion, random_batches)
    assert padded_tokens(prompt, completion, sorted_batches) >= real


def test_autocast_runs_matmuls_in_bf16_only_when_enabled() -> None:
    a = torch.randn(8, 8)
    with update_autocast(True):
        assert (a @ a).dtype == torch.bfloat16
    with update_autocast(False):
        assert (a @ a).dtype == torch.float32
    assert isinstance(bf16_supported(), bool)
    assert bf16_supported("meta") is False
