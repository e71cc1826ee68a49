"""The optional parts of the `Algorithm` contract (algorithms/base.py) the loop calls, ``load_batch`` and
``push_weights``: their defaults serve an algorithm that overrides neither, and the Trainer refuses an object that
has neither (no caller looks them up by name)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from spanrl.algorithms.base import Algorithm
from spanrl.errors import ConfigError
from spanrl.trainer.config import TrainerConfig, check_arguments


@dataclasses.dataclass
class _Config:
    def validate(self) -> _Config:
        return self


class _Plain(Algorithm):
    """Overrides only the abstract methods."""

    config_class = _Config

    def setup(self, *, model_path: Path, output_dir: Path, seed: int = 0) -> None:
        self.model = torch.nn.Linear(2, 1)

    def update(self, batch: Any) -> dict[str, float]:
        return {}

    def save(self, checkpoint_dir: Path) -> None:
        pass

    def load_state(self, checkpoint_dir: Path) -> None:
        pass


class _Server:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def reload(self, weights: Any) -> int:
        self.calls.append(("reload", weights))
        return 7

    def reload_lora(self, model: Any, merged: Any) -> int:
        self.calls.append(("reload_lora", model))
        return 8


def test_the_default_push_serves_the_plain_keyed_weights() -> None:
    algo, server = _Plain(), _Server()
    algo.setup(model_path=Path("."), output_dir=Path("."))
    assert algo.push_weights(server) == {"policy_version": 7}
    (verb, weights), = server.calls
    assert verb == "reload" and sorted(weights) == ["bias", "weight"]


@pytest.mark.parametrize("in_place", [True, False])
def test_the_default_push_reloads_a_lora_model_as_its_adapter_only_in_place(in_place: bool) -> None:
    algo, server = _Plain(), _Server()
    algo.setup(model_path=Path("."), output_dir=Path("."))
    algo.model.peft_config = {}  # what marks a PEFT model
    assert algo.push_weights(server, in_place=in_place) == {"policy_version": 8 if in_place else 7}
    assert server.calls[0][0] == ("reload_lora" if in_place else "reload")


def test_the_trainer_refuses_an_object_without_the_loops_parts(tmp_path: Path) -> None:
    class DuckTyped:  # the four abstract methods, not the two the loop also calls
        setup = update = save = load_state = staticmethod(lambda *a, **k: None)

    with pytest.raises(ConfigError, match=r"it has no load_batch\(\) \(spanrl.algorithms.base.Algorithm gives "):
        check_arguments(TrainerConfig(tasks_per_step=1), tmp_path, ["task"], DuckTyped(), None)
    assert check_arguments(TrainerConfig(tasks_per_step=1), tmp_path, ["task"], _Plain(), None) is False


def test_a_checkpoint_of_an_algorithm_not_set_up_is_refused_through_its_public_check(tmp_path: Path) -> None:
    from spanrl.algorithms.checkpoints import load_checkpoint, save_checkpoint
    from spanrl.errors import TrainingError

    for call in (save_checkpoint, load_checkpoint):
        kwargs = {"name": "plain"} if call is save_checkpoint else {}
        with pytest.raises(TrainingError, match=r"^_Plain is not set up: call setup\(\) first$"):
            call(_Plain(), tmp_path, model=None, optimizer=None, **kwargs)
    assert list(tmp_path.iterdir()) == []
