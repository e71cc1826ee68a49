"""Micro-batches cut by length, and the bf16 switch, for the policy-gradient updates."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
from toy_task import batch_of, build_model, rollouts

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

from spanrl.algorithms.tables import pad_transitions
from spanrl.algorithms.grpo import GRPO
from spanrl.algorithms.batching import (
    bf16_supported,
    head_logprobs,
    length_sorted_micro_batches,
    padded_tokens,
    plain_lm_head,
    update_autocast,
)


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


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_dense_head_matches_trls_chunked_kernel_with_entropy_gradients(temperature: float) -> None:
    """The CPU fp32 head that keeps its log-probs: TRL's chunked kernel's log-probs, entropies and
    gradients (through both, as entropy masking uses them), across more than one TRL vocabulary tile."""
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    gen = torch.Generator().manual_seed(0)
    rows, weight = torch.randn(37, 16, generator=gen), torch.randn(40_000, 16, generator=gen)
    targets = torch.randint(0, 40_000, (37,), generator=gen)
    lp_w, ent_w = torch.randn(37, generator=gen), torch.randn(37, generator=gen)

    def run(own: bool) -> list[torch.Tensor]:
        r, w = rows.clone().requires_grad_(), weight.clone().requires_grad_()
        if own:
            logps, ent = head_logprobs(r, w, None, targets, temperature=temperature, entropy=True)
        else:
            logps, ent, *_ = ChunkedLogProbFunction.apply(r, w, None, targets, temperature, 32768, None, 1.0,
                                                          ("log_probs", "entropy"))
        ((logps * lp_w).sum() + (ent * ent_w).sum()).backward()
        return [logps.detach(), ent.detach(), r.grad, w.grad]

    ours, theirs = run(True), run(False)
    assert ours[0].abs().min() > 0  # real log-probs, not zeros
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, atol=1e-5 * max(1.0, float(b.abs().max())), rtol=1e-4)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny") / "model")


def _logps_and_grads(algo: GRPO, data: object, own: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Log-probs, entropies and d(sum log-probs)/d(weights): spanrl's compact head or TRL 1.16's own path."""
    from trl import GRPOTrainer

    trainer = algo.trainer
    ids = torch.cat([data.prompt_ids, data.completion_ids], 1)
    mask = torch.cat([data.prompt_mask, data.completion_mask], 1).long()  # as GRPO gives it
    fn = (trainer._get_per_token_logps_and_entropies if own
          else partial(GRPOTrainer._get_per_token_logps_and_entropies, trainer))
    trainer.model.zero_grad(set_to_none=True)
    with update_autocast(algo.bf16):
        logps, entropy, _ = fn(trainer.model, ids, mask, data.completion_ids.size(1), compute_entropy=True)
        (logps * data.completion_mask).sum().backward()
    grads = [p.grad.clone() for p in trainer.model.parameters()]
    return logps.detach(), entropy.detach(), grads


@pytest.mark.parametrize("bf16", [False, True])
def test_compact_head_matches_trls_head_on_every_position(model_path: Path, tmp_path: Path, bf16: bool) -> None:
    """The LM head only at completion positions: the same log-probs, entropies and gradients as TRL's path
    (which projects every position off CUDA), in fp32 exactly and under bf16 autocast (fp32 head) to bf16's noise."""
    algo = GRPO(bf16=bf16)
    algo.setup(model_path=model_path, output_dir=tmp_path / "run", seed=0)
    gen = torch.Generator().manual_seed(0)
    data = pad_transitions(batch_of(rollouts(algo.model, algo.tokenizer, tasks=list(range(4)), group=4, generator=gen)),
                           pad_token_id=algo.tokenizer.pad_token_id)
    assert plain_lm_head(algo.model)  # spanrl's path is the one under test, not TRL's fallback
    data.completion_mask[::2, -1] = False  # every other completion one token shorter: right padding
    ours, theirs = _logps_and_grads(algo, data, own=True), _logps_and_grads(algo, data, own=False)
    real = data.completion_mask
    assert real.any() and not real.all()  # padding is there and must stay zero
    tol = 1e-5
    for a, b in zip(ours[:2], theirs[:2]):
        assert torch.allclose(a[real], b[real], atol=tol, rtol=tol) and not a[~real].any()
    for a, b in zip(ours[2], theirs[2]):
        if not bf16:
            assert torch.allclose(a, b, atol=tol * max(1.0, float(b.abs().max())), rtol=1e-4)
        else:  # the heads' fp32 gradients differ in summation order; bf16 backward passes amplify that to its rounding
            assert float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)) > 0.9995
            assert float((a - b).norm() / b.norm()) < 0.03


def test_bf16_update_stays_close_to_the_fp32_update(model_path: Path, tmp_path: Path) -> None:
    """bf16 autocast with the fp32 head: log-probs within bf16's rounding of fp32's, gradient direction kept."""
    fp32 = GRPO(bf16=False)
    fp32.setup(model_path=model_path, output_dir=tmp_path / "fp32", seed=0)
    bf16 = GRPO(bf16=True)
    bf16.setup(model_path=model_path, output_dir=tmp_path / "bf16", seed=0)
    gen = torch.Generator().manual_seed(1)
    data = pad_transitions(batch_of(rollouts(fp32.model, fp32.tokenizer, tasks=list(range(4)), group=4, generator=gen)),
                           pad_token_id=fp32.tokenizer.pad_token_id)
    (lp32, _, g32), (lp16, _, g16) = _logps_and_grads(fp32, data, own=True), _logps_and_grads(bf16, data, own=True)
    real = data.completion_mask
    assert float((lp32 - lp16)[real].abs().max()) < 0.05
    flat32, flat16 = torch.cat([g.flatten() for g in g32]), torch.cat([g.flatten() for g in g16])
    assert float(torch.nn.functional.cosine_similarity(flat32, flat16, dim=0)) > 0.99
    assert abs(float(flat16.norm() / flat32.norm()) - 1) < 0.05
