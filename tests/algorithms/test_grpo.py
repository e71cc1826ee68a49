"""GRPO on TRL's loss, fed sampled transitions of the tiny model."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from toy_task import batch_of, build_model, rollouts, success_rate
from training_checks import report_figures

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

from spanrl.algorithms.tables import pad_transitions
from spanrl.algorithms.grpo import GRPO, LOSS_TYPES, GRPOConfig
from spanrl.algorithms.lora import LoRAConfig
from spanrl.errors import ConfigError, TrainingError

TASKS = list(range(8))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny") / "model")


def _setup(model_path: Path, tmp_path: Path, **fields) -> GRPO:
    algo = GRPO(**fields)
    algo.setup(model_path=model_path, output_dir=tmp_path / "run", seed=0)
    return algo


def _batch(algo: GRPO, seed: int, group: int = 8) -> object:
    gen = torch.Generator().manual_seed(seed)
    return batch_of(rollouts(algo.model, algo.tokenizer, tasks=TASKS, group=group, generator=gen))


def test_default_config_validates() -> None:
    assert GRPOConfig().validate().loss_type == "dapo"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"learning_rate": 0.0}, "learning_rate must be > 0, got 0.0"),
        # a string (YAML's 1e-5 without a dot), a bool or NaN is a ConfigError naming the field, not a TypeError
        ({"learning_rate": "1e-5"}, "learning_rate must be > 0, got '1e-5'"),
        ({"temperature": True}, "temperature must be > 0, got True"),
        ({"beta": float("nan")}, "beta must be >= 0, got nan"),
        ({"epsilon_high": 0}, "epsilon_high must be > 0 or None, got 0"),
        ({"loss_type": "ppo"}, "loss_type must be one of"),
        ({"epsilon": 1.5}, "epsilon must be in (0, 1), got 1.5"),
        ({"mini_batch_size": 0}, "mini_batch_size must be a positive integer or None, got 0"),
        ({"lr_scheduler_type": "linear"}, "lr_scheduler_type='linear' needs max_steps"),
        ({"lora": LoRAConfig(r=0)}, "lora.r must be a positive integer, got 0"),
        ({"no_such_field": 1}, "unknown config field"),
        ({"bf16": "yes"}, "bf16 must be True, False or None, got 'yes'"),
    ],
)
def test_bad_config_names_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GRPO(**fields)


def test_update_before_setup_raises() -> None:
    with pytest.raises(TrainingError, match="not set up"):
        GRPO().update(batch_of([]))


def test_bad_transition_names_field_and_value(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path)
    batch = _batch(algo, seed=1, group=2)
    bad = dataclasses.replace(batch.transitions[3], old_logprobs=[0.0])
    with pytest.raises(ConfigError, match="transition 0 .*old_logprobs has 1 entries, completion_ids 3"):
        algo.update(batch_of([bad]))
    bad = dataclasses.replace(batch.transitions[3], completion_ids=[1, 2, 10_000])
    with pytest.raises(ConfigError, match="token id 10000 is outside the vocabulary"):
        algo.update(batch_of([bad]))


def test_grpo_raises_reward(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path, learning_rate=5e-4)
    before = success_rate(algo.model, algo.tokenizer, tasks=TASKS, samples=16, seed=123)
    gen = torch.Generator().manual_seed(0)
    for step in range(15):
        batch = rollouts(algo.model, algo.tokenizer, tasks=TASKS, group=8, generator=gen, step=step)
        metrics = algo.update(batch_of(batch))
    after = success_rate(algo.model, algo.tokenizer, tasks=TASKS, samples=16, seed=123)
    report_figures("grpo_raises_reward", before=before, after=after)
    assert before < 0.15
    # Seeded in-process (setup seed 0, rollouts from generator 0, the score from 123, one torch thread): the same
    # 0.016 -> 0.52 in every one of 20 runs at load 10-32, 0.20 above the bound (docs/measurements.md,
    # "Learning tests over repeated runs")
    assert after > before + 0.3, (before, after)
    assert set(metrics) >= {"losses/policy_loss", "losses/approx_kl", "losses/clipfrac", "charts/grad_norm"}


def test_server_logprobs_make_the_ratio(model_path: Path, tmp_path: Path) -> None:
    # On-policy logprobs give approx_kl ~ 0 on the first pass; shifted ones give a real ratio and clipping.
    algo = _setup(model_path, tmp_path, num_iterations=1)
    batch = _batch(algo, seed=2)
    assert algo.update(copy.deepcopy(batch))["losses/approx_kl"] < 1e-5
    for t in batch.transitions:
        t.old_logprobs = [lp - 0.5 for lp in t.old_logprobs]
    metrics = algo.update(batch)
    assert metrics["losses/approx_kl"] > 0.05
    # ratio ~ e^0.5 > 1 + epsilon: exactly the tokens with a positive advantage are clipped, of the tokens the
    # update ran (rows of advantage 0 are skipped: skip_zero_advantage)
    positive = sum(len(t.completion_ids) for t in batch.transitions if t.advantage > 0)
    total = sum(len(t.completion_ids) for t in batch.transitions if t.advantage != 0)
    assert 0 < positive < total
    assert metrics["losses/clipfrac"] == pytest.approx(positive / total, abs=0.02)


def test_unknown_logprobs_are_recomputed(model_path: Path, tmp_path: Path) -> None:
    # NaN old log-probs (a retokenized call) are filled with the current policy's: on-policy, no clipping.
    algo = _setup(model_path, tmp_path)
    batch = _batch(algo, seed=8)
    for t in batch.transitions[::2]:
        t.old_logprobs = [float("nan")] * len(t.completion_ids)
    metrics = algo.update(batch)
    assert metrics["losses/approx_kl"] < 1e-5
    assert metrics["losses/clipfrac"] == 0.0


def test_masked_tokens_do_not_move_the_policy(model_path: Path, tmp_path: Path) -> None:
    # Tokens with completion_mask 0 (tool output) must not count: changing their old logprobs changes nothing.
    batch = _batch(_setup(model_path, tmp_path / "probe"), seed=3)
    for t in batch.transitions:
        t.completion_mask = [1, 0, 1]
    other = copy.deepcopy(batch)
    for t in other.transitions:
        t.old_logprobs[1] -= 3.0
    weights = []
    for b in (batch, other):
        algo = _setup(model_path, tmp_path / f"run{len(weights)}")
        algo.update(b)
        weights.append(torch.cat([p.detach().flatten() for p in algo.model.parameters()]))
    assert torch.equal(weights[0], weights[1])


def test_rows_without_advantage_are_skipped_and_the_weights_are_the_same(model_path: Path, tmp_path: Path) -> None:
    # A row of advantage 0 (its group's rewards agree) adds nothing to dapo's gradient, and the divisor counts it
    # either way: skipping its forward and backward leaves the same weights. A step whose rows are all skipped
    # still moves the weights by AdamW's momentum, as running them would.
    batch = _batch(_setup(model_path, tmp_path / "probe"), seed=5)
    for t in batch.transitions[::2]:
        t.advantage = 0.0
    zero = copy.deepcopy(batch)
    for t in zero.transitions:
        t.advantage = 0.0
    n_zero = sum(t.advantage == 0.0 for t in batch.transitions)
    assert 0 < n_zero < len(batch.transitions)
    weights, skipped = {}, {}
    for skip in (True, False):
        algo = _setup(model_path, tmp_path / f"skip-{skip}", skip_zero_advantage=skip, bf16=False, micro_batch_size=4)
        first = algo.update(batch)
        after_first = torch.cat([p.detach().flatten() for p in algo.model.parameters()])
        second = algo.update(zero)
        weights[skip] = (after_first, torch.cat([p.detach().flatten() for p in algo.model.parameters()]))
        skipped[skip] = (first["charts/skipped_rows"], second["charts/skipped_rows"])
    assert skipped == {True: (n_zero, len(batch.transitions)), False: (0, 0)}
    # Equal up to float summation order (other micro-batches, other padding): 6e-7 at most here, where one
    # AdamW step moves a weight by up to the learning rate, 5e-4.
    for with_skip, without in zip(weights[True], weights[False]):
        assert float((with_skip - without).abs().max()) < 2e-6
    assert not torch.equal(weights[True][0], weights[True][1])  # the all-zero step moved them (momentum)
    # Where zero rows do count (the grpo loss averages over rows), nothing is skipped.
    algo = _setup(model_path, tmp_path / "grpo-loss", loss_type="grpo")
    assert algo.update(batch)["charts/skipped_rows"] == 0


def test_a_shared_prompt_prefix_runs_once_and_the_weights_are_the_same(model_path: Path, tmp_path: Path) -> None:
    # An agent's calls open with the same system prompt: 40 shared tokens before each toy prompt. Running them
    # once per micro-batch (share_prefix) leaves the weights the padded pass leaves, up to float summation order.
    batch = _batch(_setup(model_path, tmp_path / "probe"), seed=5)
    system = [t % 20 + 4 for t in range(40)]
    for t in batch.transitions:
        t.prompt_ids = system + t.prompt_ids
    weights, tokens = {}, {}
    for share in (True, False):
        algo = _setup(model_path, tmp_path / f"share-{share}", share_prefix=share, bf16=False, micro_batch_size=8)
        seen: list[int] = []
        hook = algo.model.get_input_embeddings().register_forward_hook(lambda m, a, o: seen.append(a[0].numel()))
        algo.update(copy.deepcopy(batch))
        hook.remove()
        weights[share], tokens[share] = torch.cat([p.detach().flatten() for p in algo.model.parameters()]), sum(seen)
    assert tokens[True] < tokens[False] / 2  # the prefix is most of each row here
    # AdamW's first step moves each weight by about the learning rate (5e-4) whatever its gradient's size, so
    # where a gradient is all but 0 its summation order shows: 6e-6 at most here, on 15 weights of 661,248.
    diff = (weights[True] - weights[False]).abs()
    assert float(diff.max()) < 2e-5 and int((diff > 1e-6).sum()) < 100


def test_minibatches_and_beta_use_trl_loss(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path, beta=0.04, mini_batch_size=16, micro_batch_size=8, loss_type="grpo",
                  num_iterations=2)
    batch = _batch(algo, seed=4)
    data = pad_transitions(batch.transitions, pad_token_id=algo.tokenizer.pad_token_id)
    ref = algo._logprobs(algo.trainer.model, data)  # (B, C) the reference: the policy before the update
    metrics = algo.update(batch)
    assert algo.trainer.state.global_step == 2 * 64 // 16  # iterations x optimizer steps per pass
    # kl_ref is TRL's k3 estimate of KL(policy || reference), averaged over the 8 micro-batch steps: 0 at
    # the first (policy = reference), then growing as the policy moves, so between 0 and its final value
    final = algo._logprobs(algo.trainer.model, data)
    mask = data.loss_mask
    final_kl = float((torch.exp(ref - final) - (ref - final) - 1)[mask].mean())
    assert 0.0 < metrics["losses/kl_ref"] < final_kl, (metrics["losses/kl_ref"], final_kl)


def test_save_and_resume_exactly(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path)
    algo.update(_batch(algo, seed=5))
    algo.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").exists() and (tmp_path / "ckpt" / "spanrl_config.json").exists()
    batch = _batch(algo, seed=6)
    continued = algo.update(copy.deepcopy(batch))
    resumed = _setup(model_path, tmp_path / "again")
    resumed.load_state(tmp_path / "ckpt")
    again = resumed.update(copy.deepcopy(batch))
    assert again["losses/policy_loss"] == pytest.approx(continued["losses/policy_loss"], abs=1e-6)
    for p, q in zip(algo.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(p, q)
    assert resumed.step == algo.step == 2


def test_lora_trains_only_the_adapter_and_saves_a_loadable_folder(model_path: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    algo = _setup(model_path, tmp_path, lora=LoRAConfig(r=4, adapter_name="solver"))
    base = {n: p.detach().clone() for n, p in algo.model.named_parameters() if "lora_" not in n}
    algo.update(_batch(algo, seed=7))
    assert all(torch.equal(p, base[n]) for n, p in algo.model.named_parameters() if "lora_" not in n)
    algo.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "adapters" / "solver" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    ids = torch.tensor([[1, 5, 6]])
    torch.testing.assert_close(merged(input_ids=ids).logits, algo.model(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
    # what the policy server reloads: the plain model's keys, adapter merged
    plain = AutoModelForCausalLM.from_pretrained(model_path)
    weights = algo.policy_weights()
    assert set(weights) == set(plain.state_dict())
    plain.load_state_dict(weights)
    torch.testing.assert_close(plain(input_ids=ids).logits, merged(input_ids=ids).logits)


def test_an_update_returns_its_metrics_and_writes_no_report(model_path: Path, tmp_path: Path) -> None:
    """The caller reports (the Trainer's callbacks, each key once): TRL's own reporters stay off."""
    algo = _setup(model_path, tmp_path)
    metrics = algo.update(_batch(algo, seed=9, group=2))
    assert "losses/policy_loss" in metrics
    assert algo.trainer.args.report_to in ([], "none", ["none"])
    assert not list((tmp_path / "run").rglob("events.out.tfevents.*"))


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_trl_loss_type_updates_the_policy(model_path: Path, tmp_path: Path, loss_type: str) -> None:
    algo = _setup(model_path, tmp_path, loss_type=loss_type)
    before = torch.cat([p.detach().flatten().clone() for p in algo.model.parameters()])
    batch = _batch(algo, seed=10, group=4)
    for i, t in enumerate(batch.transitions):
        t.advantage = 1.0 if i % 2 else -1.0
    metrics = algo.update(batch)
    assert all(v == v for v in metrics.values()), metrics  # no NaN
    assert not torch.equal(before, torch.cat([p.detach().flatten() for p in algo.model.parameters()]))
