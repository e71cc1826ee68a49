"""SFT on TRL's SFTTrainer: rejection sampling and demonstrations, completion-only loss."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
from toy_task import TARGET, batch_of, build_model, prompt_ids, rollouts, success_rate
from training_checks import report_figures

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

from spanrl.algorithms.sft import SFT, SFTConfig, select_transitions
from spanrl.errors import ConfigError

TASKS = list(range(8))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny") / "model")


def _setup(model_path: Path, tmp_path: Path, **fields) -> SFT:
    algo = SFT(**fields)
    algo.setup(model_path=model_path, output_dir=tmp_path / "run", seed=0)
    return algo


def _weights(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"epochs": 0}, "epochs must be a positive integer, got 0"),
        ({"learning_rate": -1.0}, "learning_rate must be > 0, got -1.0"),
        ({"batch_size": 2.5}, "batch_size must be a positive integer, got 2.5"),
        ({"gradient_checkpointing": "yes"}, "gradient_checkpointing must be True or False, got 'yes'"),
    ],
)
def test_bad_config_names_the_field(fields: dict, message: str) -> None:
    assert SFTConfig().validate().reward_threshold == 0.5
    with pytest.raises(ConfigError, match=message):
        SFT(**fields)


def test_rejection_sampling_raises_reward(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path, learning_rate=5e-4, epochs=2, reward_threshold=1.0)
    before = success_rate(algo.model, algo.tokenizer, tasks=TASKS, samples=16, seed=123)
    gen = torch.Generator().manual_seed(0)
    for step in range(4):
        batch = rollouts(algo.model, algo.tokenizer, tasks=TASKS, group=16, generator=gen, step=step)
        metrics = algo.update(batch_of(batch))
        assert metrics["charts/selected"] == sum(t.reward >= 1.0 for t in batch)
    after = success_rate(algo.model, algo.tokenizer, tasks=TASKS, samples=16, seed=123)
    report_figures("rejection_sampling_raises_reward", before=before, after=after)
    # Seeded in-process (setup seed 0, rollouts from generator 0, the score from 123, one torch thread): the same
    # 0.016 -> 0.55 in every one of 20 runs at load 10-32, 0.24 above the bound (docs/measurements.md,
    # "Learning tests over repeated runs")
    assert after > before + 0.3, (before, after)
    assert math.isfinite(metrics["losses/sft_loss"])


def test_nothing_selected_leaves_the_model_unchanged(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path, reward_threshold=2.0)
    gen = torch.Generator().manual_seed(1)
    batch = rollouts(algo.model, algo.tokenizer, tasks=TASKS, group=2, generator=gen)
    before = _weights(algo.model)
    metrics = algo.update(batch_of(batch))
    assert metrics["charts/selected"] == 0.0
    assert torch.equal(before, _weights(algo.model))


def test_demonstrations_learn_only_unmasked_tokens(model_path: Path, tmp_path: Path) -> None:
    # Demonstration: "yes w1 w2" where w1 is tool output (mask 0). SFT must learn "yes" and "w2", not w1.
    algo = _setup(model_path, tmp_path, reward_threshold=None, epochs=30, batch_size=8)
    tok = algo.tokenizer
    yes, w1, w2 = tok.convert_tokens_to_ids([TARGET, "w1", "w2"])
    demos = rollouts(algo.model, tok, tasks=TASKS, group=1, generator=torch.Generator().manual_seed(2))
    for t in demos:
        t.completion_ids, t.completion_mask, t.old_logprobs = [yes, w1, w2], [1, 0, 1], []
    assert len(select_transitions(demos, None)) == len(demos)
    algo.update(batch_of(demos))
    with torch.no_grad():
        ids = torch.tensor([prompt_ids(tok, 0) + [yes, w1]])
        probs = algo.model(input_ids=ids).logits[0].softmax(-1)
    assert probs[-3, yes] > 0.6  # after the prompt: "yes" was learned
    assert probs[-1, w2] > 0.6  # after the tool output: "w2" was learned
    assert probs[-2, w1] < 0.2  # the tool output itself was not


def test_checkpointing_is_off_unless_asked_and_changes_no_weight(model_path: Path, tmp_path: Path) -> None:
    """TRL's SFTConfig turns activation checkpointing on by default (a second forward per micro-batch): off here
    unless asked, and asking gives the same update."""
    from spanrl.hf_compat import checkpointing_on

    demos, weights = None, []
    for ckpt in (False, True):
        algo = _setup(model_path, tmp_path / str(ckpt), reward_threshold=None, batch_size=4,
                      gradient_checkpointing=ckpt)
        demos = demos or rollouts(algo.model, algo.tokenizer, tasks=TASKS, group=1,
                                  generator=torch.Generator().manual_seed(3))
        algo.update(batch_of(copy.deepcopy(demos)))
        assert checkpointing_on(algo.model) is ckpt
        weights.append(_weights(algo.model))
    torch.testing.assert_close(weights[1], weights[0], rtol=1e-5, atol=1e-7)


def test_save_and_resume(model_path: Path, tmp_path: Path) -> None:
    algo = _setup(model_path, tmp_path, reward_threshold=None)
    gen = torch.Generator().manual_seed(3)
    batch = batch_of(rollouts(algo.model, algo.tokenizer, tasks=TASKS, group=2, generator=gen))
    algo.update(copy.deepcopy(batch))
    algo.save(tmp_path / "ckpt")
    algo.update(copy.deepcopy(batch))
    resumed = _setup(model_path, tmp_path / "again", reward_threshold=None)
    resumed.load_state(tmp_path / "ckpt")
    resumed.update(copy.deepcopy(batch))
    torch.testing.assert_close(_weights(algo.model), _weights(resumed.model))
