"""GRPO's loss plumbing on values worked out by hand: what goes into TRL's loss (trimmed inputs, the token
divisor), what comes out (the update's loss, the metrics), the k3 KL and the optimizer step. Fast: a few
transitions of the tiny model, so that ``make mutation`` can run this file on every mutant of grpo.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from toy_task import batch_of, build_model, prompt_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

from spanrl.algorithms.tables import pad_transitions
from spanrl.algorithms.grpo import GRPO, _approx_kl
from spanrl.algorithms.transitions import Transition


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny") / "model")


def _setup(model_path: Path, tmp_path: Path, **fields) -> GRPO:
    algo = GRPO(**fields)
    algo.setup(model_path=model_path, output_dir=tmp_path / "run", seed=0)
    return algo


def _t(prompt: list[int], mask: list[int], advantage: float, reward: float = 0.0) -> Transition:
    # no old log-probs: the update computes them with the current policy, so the first ratio is exactly 1
    return Transition(
        rollout_id="r", task_id=None, attempt=None, agent=None, step=0, prompt_ids=prompt,
        completion_ids=[5 + i for i in range(len(mask))], completion_mask=mask, old_logprobs=[],
        reward=reward, advantage=advantage, policy_version=None, retokenized=False,
    )


def test_approx_kl_is_k3_over_the_loss_tokens() -> None:
    # log ratios 0, ln 2, ln 1/2; the third token is tool output: k3 = (2 - 1 - ln 2) + 0 over 2 tokens
    inputs = {
        "completion_mask": torch.tensor([[1, 1, 1]]), "tool_mask": torch.tensor([[1, 1, 0]]),
        "old_per_token_logps": torch.tensor([[-1.0, -1.0, -1.0]]),
    }
    new = torch.tensor([[-1.0, -1.0 + math.log(2.0), -1.0 - math.log(2.0)]])
    kl_sum, tokens = _approx_kl(new, inputs)
    assert kl_sum == pytest.approx(1.0 - math.log(2.0), abs=1e-6)
    assert tokens == 2.0


def test_update_loss_is_the_token_weighted_advantage(model_path: Path, tmp_path: Path) -> None:
    # ratio 1 (on-policy): dapo's token loss is -A, summed over the 3 micro-batches and divided by the
    # mini-batch's loss tokens: -(1*2 - 2*1 + 0.5*3 + 3*1 + 0 + 0) / 10 (more rows than prompt columns)
    algo = _setup(model_path, tmp_path, micro_batch_size=2)
    p = prompt_ids(algo.tokenizer, 0)
    batch = [_t(p, [1, 0, 1], 1.0, reward=1.0), _t(p, [1], -2.0), _t(p, [1, 1, 1], 0.5, reward=1.0),
             _t(p, [1, 0], 3.0), _t(p, [1], 0.0), _t(p, [1, 1], 0.0)]
    metrics = algo.update(batch_of(batch))
    assert metrics["losses/policy_loss"] == pytest.approx(-0.45, abs=1e-5)
    assert metrics["losses/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["charts/transitions"] == 6
    assert metrics["charts/reward_mean"] == pytest.approx(1 / 3)
    # sample std of [1, -2, 0.5, 3, 0, 0]: sum 2.5, squares 14.25, so (14.25 - 2.5^2 / 6) / 5
    assert metrics["charts/advantage_std"] == pytest.approx(math.sqrt((14.25 - 6.25 / 6) / 5), rel=1e-6)
    assert metrics["charts/learning_rate"] == pytest.approx(5e-4)
    assert metrics["charts/grad_norm"] > 0
    assert metrics["charts/step"] == 1.0 and algo.trainer.state.global_step == 1
    assert "losses/kl_ref" not in metrics
    assert 0.0 < metrics["charts/update_seconds"] < 600.0
    assert not algo.trainer.state.log_history  # algorithms write no reports: nothing goes through Trainer.log


def test_update_reports_the_k3_kl_to_the_server_logprobs(model_path: Path, tmp_path: Path) -> None:
    # old log-probs 0.5 above the policy's on every loss token: log ratio -0.5, k3 = e^-0.5 - 1 + 0.5
    algo = _setup(model_path, tmp_path, micro_batch_size=1)
    p = prompt_ids(algo.tokenizer, 2)
    batch = [_t(p, [1, 1], 1.0), _t(p, [1, 0, 1], -1.0)]
    current = algo._logprobs(algo.trainer.model, pad_transitions(batch, pad_token_id=algo.tokenizer.pad_token_id))
    for t, row in zip(batch, current):
        t.old_logprobs = [lp + 0.5 if m else 0.0 for lp, m in zip(row.tolist(), t.completion_mask)]
    metrics = algo.update(batch_of(batch))
    assert metrics["losses/approx_kl"] == pytest.approx(math.exp(-0.5) - 0.5, rel=1e-4)


def test_every_mini_batch_is_one_step(model_path: Path, tmp_path: Path) -> None:
    # one transition and one loss token per mini-batch, 2 passes: 8 steps, each loss -A (divisor 1 token);
    # a learning rate of 1e-12 keeps every ratio 1, so the mean is -mean(A) = 0.25
    algo = _setup(model_path, tmp_path, mini_batch_size=1, num_iterations=2, learning_rate=1e-12, beta=0.04)
    p = prompt_ids(algo.tokenizer, 1)
    batch = [_t(p, [1], a) for a in (1.0, -1.0, 2.0, -3.0)]
    metrics = algo.update(batch_of(batch))
    assert algo.trainer.state.global_step == 8
    assert metrics["losses/policy_loss"] == pytest.approx(0.25, abs=1e-5)
    assert metrics["losses/kl_ref"] == pytest.approx(0.0, abs=1e-6)  # policy = reference


def test_trl_inputs_trim_the_padding_and_scale_the_tokens(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path)
    data = pad_transitions([_t([3, 4, 5, 6, 7], [1, 1, 1], 1.0), _t([3, 4], [1, 0, 1], 2.0),
                            _t([3, 4, 5], [1], 3.0)], pad_token_id=algo.tokenizer.pad_token_id)
    data.old_logprobs = torch.arange(9, dtype=torch.float32).reshape(3, 3)
    ref = -torch.arange(9, dtype=torch.float32).reshape(3, 3)
    rows = torch.tensor([1, 2])
    inputs = algo._trl_inputs(data.select(rows), ref, rows, 10.0, 4)
    # rows 1 and 2: prompts of 2 and 3 tokens (left-padded to 5: keep the last 3 columns), completions of 3 and 1
    assert inputs["prompt_ids"].tolist() == [[algo.tokenizer.pad_token_id, 3, 4], [3, 4, 5]]
    assert inputs["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]] and inputs["prompt_mask"].dtype == torch.long
    assert inputs["completion_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert inputs["tool_mask"].tolist() == [[1, 0, 1], [1, 0, 0]] and inputs["tool_mask"].dtype == torch.long
    assert inputs["advantages"].tolist() == [2.0, 3.0]
    assert inputs["old_per_token_logps"].tolist() == [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]
    assert inputs["ref_per_token_logps"].tolist() == [[-3.0, -4.0, -5.0], [-6.0, -7.0, -8.0]]
    assert float(inputs["num_items_in_batch"]) == 2.5  # 10 tokens / 4 micro-batches x 1 process per rank
    # one short completion: its columns only
    one = algo._trl_inputs(data.select(torch.tensor([2])), None, torch.tensor([2]), 1.0, 1)
    assert one["completion_ids"].shape == (1, 1) and "ref_per_token_logps" not in one


def _stats(policy_loss: list[float], grad_norm: list[float], kl: list[float]) -> dict[str, list[float]]:
    """What ``GRPO.update`` collects for ``_metrics`` (no row skipped)."""
    return {"policy_loss": policy_loss, "grad_norm": grad_norm, "kl": kl, "skipped": [0.0]}


def test_metrics_average_the_steps_over_the_real_rows(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path, beta=0.1)
    data = pad_transitions([_t([3], [1], 1.0, reward=1.0), _t([3], [1, 1], 3.0, reward=0.0),
                            _t([3], [0, 0], 100.0, reward=5.0)], pad_token_id=0)  # the last row is inert
    algo.trainer._metrics["train"].clear()
    algo.trainer._metrics["train"].update({"clip_ratio/region_mean": [0.1, 0.3], "entropy": [2.0], "kl": [0.5, 1.5]})
    stats = _stats([1.0, 3.0], [2.0, 4.0], [0.6, 3.0])
    metrics = algo._metrics(stats, data, 1.5)
    assert metrics["losses/policy_loss"] == 2.0 and metrics["charts/grad_norm"] == 3.0
    assert metrics["losses/approx_kl"] == pytest.approx(0.2)
    assert metrics["losses/clipfrac"] == pytest.approx(0.2) and metrics["losses/entropy"] == 2.0
    assert metrics["losses/kl_ref"] == 1.0
    assert metrics["charts/reward_mean"] == 0.5 and metrics["charts/transitions"] == 2
    assert metrics["charts/advantage_std"] == pytest.approx(math.sqrt(2.0))  # std of [1, 3]
    assert metrics["charts/update_seconds"] == 1.5 and metrics["charts/step"] == 0.0
    assert not algo.trainer._metrics["train"]
    # one real row: no spread; no KL tokens: 0
    single = algo._metrics(_stats([1.0], [1.0], [0.0, 0.0]), data.select(slice(0, 1)), 0.0)
    assert single["charts/advantage_std"] == 0.0 and single["losses/approx_kl"] == 0.0
    assert single["charts/reward_mean"] == 1.0 and single["losses/entropy"] == 0.0
    inert = algo._metrics(_stats([0.0], [0.0], [0.0, 0.0]), data.select(slice(2, 3)), 0.0)
    assert inert["charts/transitions"] == 0 and inert["charts/reward_mean"] == 0.0  # no row with a loss token
    assert single["losses/clipfrac"] == 0.0 and single["losses/kl_ref"] == 0.0
    # equal advantages: float32 rounding makes the variance -7e-9, which must read as 0
    same = pad_transitions([_t([3], [1], 0.3), _t([3], [1], 0.3)], pad_token_id=0)
    both = algo._metrics(_stats([1.0], [1.0], [0.3, 1.0]), same, 0.0)
    assert both["charts/advantage_std"] == 0.0 and both["losses/approx_kl"] == 0.3  # one KL token


def _set_grads(algo: GRPO, value: float) -> int:
    params = [p for p in algo.model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.full_like(p, value)
    return sum(p.numel() for p in params)


@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0, 1e-6])
def test_optimizer_step_returns_the_pre_clip_norm(model_path: Path, tmp_path: Path, max_grad_norm: float) -> None:
    algo = _setup(model_path, tmp_path, max_grad_norm=max_grad_norm, learning_rate=0.01)
    before = [p.detach().clone() for p in algo.model.parameters()]
    n = _set_grads(algo, 0.5)
    norm = 0.5 * math.sqrt(n)
    assert algo._optimizer_step() == pytest.approx(norm, rel=1e-5)
    assert algo.trainer.state.global_step == 1
    assert all(p.grad is None for p in algo.model.parameters())
    # Adam's first step moves every weight by lr * g / (|g| + 1e-8): the learning rate unless clipping to
    # 1e-6 made g ~1e-9 (torch clips by max_norm / (norm + 1e-6); 0 = no clipping)
    g = 0.5 * (min(1.0, max_grad_norm / (norm + 1e-6)) if max_grad_norm > 0 else 1.0)
    for p, q in zip(algo.model.parameters(), before):
        torch.testing.assert_close(p.detach(), q - 0.01 * g / (g + 1e-8), atol=1e-5, rtol=0)


def test_optimizer_step_skips_a_nan_gradient(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path, max_grad_norm=0.0)
    before = [p.detach().clone() for p in algo.model.parameters()]
    _set_grads(algo, float("nan"))
    assert math.isnan(algo._optimizer_step())
    assert algo.trainer.state.global_step == 0
    assert all(p.grad is None for p in algo.model.parameters())
    assert all(torch.equal(p, q) for p, q in zip(algo.model.parameters(), before))


@pytest.mark.parametrize("lora", [False, True])
def test_kl_ref_is_k3_against_the_reference(model_path: Path, tmp_path: Path, lora: bool) -> None:
    # the reference: TRL's copy of the initial model, or with LoRA (no copy) the model with its adapter off.
    # Perturbing the policy (its adapter) makes them differ from the first step; lr 1e-12 keeps the policy
    # where it is, so TRL's kl_ref (one micro-batch) is k3(ref - policy) averaged over the loss tokens
    from spanrl.algorithms.lora import LoRAConfig

    algo = _setup(model_path, tmp_path, lora=LoRAConfig(r=4) if lora else None, beta=0.1, learning_rate=1e-12)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in algo.model.named_parameters():
            if "lora_B" in name or not lora:
                param.add_(torch.randn(param.shape, generator=gen) * (2.0 if lora else 0.2))
    p = prompt_ids(algo.tokenizer, 3)
    batch = [_t(p, [1, 1, 1], 1.0), _t(p, [1, 0], -1.0)]
    data = pad_transitions(batch, pad_token_id=algo.tokenizer.pad_token_id)
    policy = algo._logprobs(algo.model, data)
    if lora:
        with algo.model.disable_adapter():
            ref = algo._logprobs(algo.model, data)
    else:
        ref = algo._logprobs(algo.trainer.ref_model, data)
    d = (ref - policy)[data.loss_mask]
    expected = float((d.exp() - d - 1).mean())
    assert expected > 1e-3  # the reference differs from the policy
    assert algo.update(batch_of(batch))["losses/kl_ref"] == pytest.approx(expected, rel=1e-3)
