"""GSPO and Dr. GRPO as named presets: every coupled field set, contradictions refused with the field named."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.grpo import GRPOConfig
from spanrl.algorithms.presets import check_credit
from spanrl.errors import ConfigError


def test_gspo_preset_sets_every_coupled_field() -> None:
    cfg = GRPOConfig(preset="gspo").validate()
    assert (cfg.importance_sampling_level, cfg.loss_type, cfg.beta, cfg.epsilon, cfg.epsilon_high) == (
        "sequence", "grpo", 0.0, 3e-4, 4e-4)
    assert GRPOConfig(preset="gspo", learning_rate=1e-6).validate().learning_rate == 1e-6  # others untouched


def test_dr_grpo_preset_sets_the_loss_and_needs_unscaled_credit() -> None:
    cfg = GRPOConfig(preset="dr_grpo").validate()
    assert (cfg.loss_type, cfg.importance_sampling_level) == ("dr_grpo", "token")
    with pytest.raises(ConfigError, match=r"^credit scale_std must be false with preset 'dr_grpo' \(Dr. GRPO does "
                                          r"not divide advantages by a std; with baseline 'grpo' scale_std divides "
                                          r"by the group std\), got true$"):
        check_credit(cfg, CreditConfig())
    check_credit(cfg, CreditConfig(scale_std=False))
    check_credit(cfg, CreditConfig(baseline="none", scale_std=False))


@pytest.mark.parametrize(("baseline", "divided"), [
    ("none", "the batch std (it whitens the batch)"), ("running", "the running std"), ("rloo", "the group std")])
def test_dr_grpo_refuses_every_baseline_that_divides_by_a_std(baseline: str, divided: str) -> None:
    # baseline none with scale_std whitens the batch: (A - mean) / (std + eps), a division Dr. GRPO removes
    with pytest.raises(ConfigError, match=rf"with baseline '{baseline}' scale_std divides by {re.escape(divided)}\)"):
        check_credit(GRPOConfig(loss_type="dr_grpo"), CreditConfig(baseline=baseline))
    check_credit(GRPOConfig(loss_type="dr_grpo"), CreditConfig(baseline=baseline, scale_std=False))
    check_credit(GRPOConfig(), CreditConfig())  # dapo: nothing coupled


@pytest.mark.parametrize(("fields", "message"), [
    ({"preset": "gspo", "loss_type": "bnpo"}, "loss_type must be 'grpo' with preset 'gspo', got 'bnpo'"),
    ({"preset": "gspo", "loss_type": "grpo"}, None),  # what the preset sets, given again
    ({"preset": "gspo", "epsilon": 0.2}, "epsilon must be 0.0003 with preset 'gspo', got 0.2"),  # the default, asked
    ({"preset": "gspo", "loss_type": "dapo"}, "loss_type must be 'grpo' with preset 'gspo', got 'dapo'"),
    ({"preset": "gspo", "epsilon": 0.1}, "epsilon must be 0.0003 with preset 'gspo', got 0.1"),
    ({"preset": "dr_grpo", "importance_sampling_level": "sequence"},
     "importance_sampling_level must be 'token' with preset 'dr_grpo', got 'sequence'"),
    ({"preset": "ppo"}, "preset must be one of gspo, dr_grpo or None, got 'ppo'"),
    ({"importance_sampling_level": "sequence"},
     "importance_sampling_level 'sequence' with loss_type 'dapo' is not GSPO: that loss sums per-token terms, so "
     "each sequence weighs by its length; use preset 'gspo' (loss_type 'grpo') or importance_sampling_level 'token'"),
])
def test_inconsistent_combinations_are_refused(fields: dict, message: str | None) -> None:
    if message is None:
        GRPOConfig(**fields).validate()
        return
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        GRPOConfig(**fields).validate()


def test_sequence_ratios_with_the_grpo_loss_need_no_preset() -> None:
    GRPOConfig(importance_sampling_level="sequence", loss_type="grpo").validate()


def test_load_training_batch_refuses_dr_grpo_with_scaled_credit(collector: object) -> None:
    from types import SimpleNamespace

    from spanrl.algorithms.transitions import load_training_batch

    algorithm = SimpleNamespace(config=GRPOConfig(preset="dr_grpo").validate())
    with pytest.raises(ConfigError, match=r"^credit scale_std must be false with preset 'dr_grpo'"):
        load_training_batch(collector.store, algorithm, credit=CreditConfig())  # type: ignore[attr-defined]


def test_a_trainer_builds_its_default_credit_as_the_preset_couples_it(tmp_path: Path) -> None:
    from spanrl.algorithms import GRPO
    from spanrl.trainer import Trainer

    given: dict[str, Any] = dict(model=tmp_path, agent=lambda task, llm: None, tasks=[{"id": "a"}], tasks_per_step=1,
                                 output_dir=tmp_path / "run")
    assert Trainer(algorithm=GRPO(preset="dr_grpo"), **given).credit.scale_std is False
    assert Trainer(algorithm=GRPO(), **given).credit.scale_std is True
    with pytest.raises(ConfigError, match=r"^credit scale_std must be false with preset 'dr_grpo'"):
        Trainer(algorithm=GRPO(preset="dr_grpo"), credit=CreditConfig(), **given)  # before any rollout


def test_unset_defaults_read_write_and_copy_as_their_values() -> None:
    import dataclasses
    import json
    import pickle

    cfg = GRPOConfig()
    assert (cfg.loss_type, cfg.epsilon, cfg.beta) == ("dapo", 0.2, 0.0) and cfg.loss_type in {"dapo"}
    assert json.loads(json.dumps(dataclasses.asdict(cfg)))["loss_type"] == "dapo"  # config.json
    assert pickle.loads(pickle.dumps(cfg)).loss_type == "dapo"
    # a copy keeps unset fields unset, so a preset given to the copy still fills them
    assert dataclasses.replace(cfg, preset="gspo").validate().loss_type == "grpo"
    gspo = GRPOConfig(preset="gspo").validate()
    assert dataclasses.replace(gspo, learning_rate=1e-5).validate().epsilon == 3e-4  # set values stay set


def test_unset_marks_strings_and_floats_only_and_yaml_writes_them_plain() -> None:
    import dataclasses

    import yaml

    from spanrl.algorithms.presets import unset

    assert yaml.safe_load(yaml.safe_dump(dataclasses.asdict(GRPOConfig())))["loss_type"] == "dapo"
    assert yaml.dump({"epsilon": GRPOConfig().epsilon}) == "epsilon: 0.2\n"  # no python/object tag
    with pytest.raises(TypeError, match=r"^unset\(\) marks a str or float default, got int$"):
        unset(3)
