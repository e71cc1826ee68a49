"""Checked weights (issue 28): no checkpoint of non-finite weights, no optimizer step on a non-finite
gradient, and the training state read back with ``torch.load(..., weights_only=True)`` (item 9).
Real GRPO / PPO updates (forward and backward) on the tiny model."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest
import torch

from toy_task import batch_of, build_model, rollouts

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

from spanrl.algorithms.checkpoints import STATE_FILE
from spanrl.algorithms.grpo import GRPO
from spanrl.algorithms.ppo import PPO
from spanrl.errors import TrainingError

TASKS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny") / "model")


def _setup(cls, model_path: Path, tmp_path: Path):
    algo = cls()
    algo.setup(model_path=model_path, output_dir=tmp_path / "run", seed=0)
    return algo


def _transitions(algo, seed: int):
    return rollouts(algo.model, algo.tokenizer, tasks=TASKS, group=4, generator=torch.Generator().manual_seed(seed))


def test_a_checkpoint_of_non_finite_weights_is_never_written(model_path, tmp_path):
    algo = _setup(GRPO, model_path, tmp_path)
    algo.update(batch_of(_transitions(algo, 1)))
    algo.save(tmp_path / "checkpoint-1")
    with torch.no_grad():
        algo.model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(TrainingError,
                       match=r"not saving .*checkpoint-2: weight model.layers.0.mlp.down_proj.weight is not finite"):
        algo.save(tmp_path / "checkpoint-2")
    assert not (tmp_path / "checkpoint-2").exists()
    algo.load_state(tmp_path / "checkpoint-1")  # the last good one is intact and loads
    assert all(bool(torch.isfinite(p).all()) for p in algo.model.parameters())

    # A checkpoint of NaN weights written before save checked them is not loaded either.
    with torch.no_grad():
        algo.model.model.norm.weight[0] = float("inf")
    algo.model.save_pretrained(tmp_path / "checkpoint-1")
    with pytest.raises(TrainingError, match=r"not loading .*checkpoint-1: weight model.norm.weight is not finite"):
        _setup(GRPO, model_path, tmp_path / "again").load_state(tmp_path / "checkpoint-1")


@pytest.mark.parametrize("cls", [GRPO, PPO])
def test_an_update_with_a_non_finite_gradient_leaves_the_weights(model_path, tmp_path, cls):
    """Advantages of 3e38 are finite in float64 and float32, but the loss and its gradient overflow."""
    algo = _setup(cls, model_path, tmp_path)
    before = copy.deepcopy(algo.model.state_dict())
    huge = [dataclasses.replace(t, advantage=3e38 if t.advantage >= 0 else -3e38, reward=3e38)
            for t in _transitions(algo, 2)]
    metrics = algo.update(batch_of(huge))
    assert not torch.isfinite(torch.tensor(metrics["charts/grad_norm"]))
    for key, tensor in algo.model.state_dict().items():
        torch.testing.assert_close(tensor, before[key], msg=key)


def test_training_state_loads_with_weights_only_and_refuses_code(model_path, tmp_path):
    algo = _setup(GRPO, model_path, tmp_path)
    algo.update(batch_of(_transitions(algo, 3)))
    algo.save(tmp_path / "ckpt")
    state = torch.load(tmp_path / "ckpt" / STATE_FILE, weights_only=True)  # plain tensors and values only
    assert set(state) >= {"optimizer", "rng", "step", "scheduler"}

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({**state, "evil": Payload()}, tmp_path / "ckpt" / STATE_FILE)
    with pytest.raises(pickle.UnpicklingError):
        _setup(GRPO, model_path, tmp_path / "b").load_state(tmp_path / "ckpt")
    assert not marker.exists()
