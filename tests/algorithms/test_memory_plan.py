"""The memory plan: its counts against the real model and PEFT, each part by hand, and ``spanrl train --plan``
printing the plan or refusing a config that cannot fit with the knob that lowers it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from spanrl.algorithms.grpo import GRPOConfig
from spanrl.algorithms.lora import LoRAConfig
from spanrl.algorithms.memory_plan import plan_memory
from spanrl.algorithms.ppo import PPOConfig
from spanrl.cli import main
from spanrl.demo.tiny import build_tiny_model
from spanrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
HIDDEN, LAYERS, FFN = 64, 2, 96


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", words=["add", "sub"], hidden_size=HIDDEN,
                            num_layers=LAYERS, num_heads=4, intermediate_size=FFN)


def test_parameter_counts_are_the_models_and_lora_trainables_are_peft_s(tiny: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    plan = plan_memory(tiny, GRPOConfig(), rows=4, prompt_tokens=16, embedded_server=False, capacity=1 << 40)
    assert (plan.params, plan.trainable) == (params, params)
    lora = LoRAConfig(r=4, target_modules=("q_proj", "v_proj"))
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trainable = sum(p.numel() for p in peft.parameters() if p.requires_grad)
    with_lora = plan_memory(tiny, GRPOConfig(lora=lora), rows=4, prompt_tokens=16, embedded_server=False,
                            capacity=1 << 40)
    assert with_lora.trainable == trainable and with_lora.params == params


def test_each_part_by_hand(tiny: Path) -> None:
    config = GRPOConfig(micro_batch_size=2, max_completion_length=8, bf16=True, beta=0.1)
    plan = plan_memory(tiny, config, rows=6, prompt_tokens=24, serving_dtype="bfloat16", capacity=1 << 40)
    vocab = plan.parts["log-probs"] // (2 * 8 * 4 * 2)
    n = plan.params
    tokens = 2 * (24 + 8)  # one micro-batch of 2 rows
    per_token_layer = 3 * HIDDEN * 4 + (4 * HIDDEN + 3 * FFN) * 2
    assert plan.parts["weights"] == 4 * n and plan.parts["gradients"] == 4 * n and plan.parts["optimizer"] == 8 * n
    assert plan.parts["activations"] == tokens * LAYERS * per_token_layer
    assert plan.parts["reference"] == 4 * n  # beta > 0 without LoRA: a frozen copy
    assert plan.parts["serving"] == 2 * n  # the embedded server's bf16 copy
    assert vocab * 2 * 8 * 4 * 2 == plan.parts["log-probs"] and vocab > 10
    checkpointed = plan_memory(tiny, PPOConfig(mini_batch_size=2, gradient_checkpointing=True),
                               rows=6, prompt_tokens=24, completion_tokens=8, embedded_server=False, capacity=1 << 40)
    assert checkpointed.parts["activations"] == tokens * (LAYERS * HIDDEN * 4 + per_token_layer)
    assert checkpointed.parts["critic"] == 16 * n and "reference" not in checkpointed.parts
    lora = plan_memory(tiny, PPOConfig(lora=LoRAConfig(r=4)), rows=6, prompt_tokens=24, completion_tokens=8,
                       embedded_server=False, capacity=1 << 40)
    assert lora.parts["critic"] == 4 * n + 16 * lora.trainable  # a frozen copy and the adapters' AdamW state
    assert plan.total == sum(plan.parts.values()) and plan.fits


def test_a_plan_that_cannot_fit_names_the_largest_part_and_its_knob(tiny: Path) -> None:
    plan = plan_memory(tiny, GRPOConfig(max_completion_length=8), rows=64, prompt_tokens=200_000,
                       embedded_server=False, capacity=2 << 30)
    assert not plan.fits
    with pytest.raises(ConfigError, match=r"largest part is activations .* algorithm.micro_batch_size"):
        plan.check()


def _calculator_config(tmp_path: Path) -> Path:
    example = REPO / "examples" / "calculator"
    for name in ("agent.py", "tasks.jsonl", "val.jsonl"):
        shutil.copy(example / name, tmp_path / name)
    raw = yaml.safe_load((example / "train.yaml").read_text())
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump({**raw, "output_dir": str(tmp_path / "run")}))
    return path


def test_train_plan_prints_every_part_and_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(_calculator_config(tmp_path)), "--plan"]) == 0
    shown = capsys.readouterr().out
    assert "memory plan on cpu" in shown and "fits" in shown
    for part in ("weights", "gradients", "optimizer", "activations", "log-probs", "serving", "runtime", "total"):
        assert f"  {part}" in shown, part
    assert not (tmp_path / "run" / "history.jsonl").exists()  # nothing was trained


def test_train_refuses_a_config_that_cannot_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", str(_calculator_config(tmp_path)), "--plan-prompt-tokens", "100000000"])
    err = capsys.readouterr().err
    assert code == 2, err  # a config that cannot fit is bad input
    assert err.startswith("spanrl: error: memory plan:") and "does not fit" in err and "activations" in err
    assert "micro_batch_size" in err
    assert not (tmp_path / "run" / "history.jsonl").exists()


def test_grpo_gradient_checkpointing_gives_the_same_update(tiny: Path, tmp_path: Path) -> None:
    """The GRPO key turns checkpointing on for TRL's model, and the update's numbers stay the same."""
    import copy

    import torch

    from spanrl.algorithms.grpo import GRPO
    from spanrl.algorithms.transitions import Transition
    from spanrl.hf_compat import checkpointing_on

    gen = torch.Generator().manual_seed(0)
    batch = [Transition(rollout_id=f"r{i}", task_id="t", attempt=1, agent=None, step=0,
                        prompt_ids=torch.randint(4, 12, (12,), generator=gen).tolist(),
                        completion_ids=torch.randint(4, 12, (5,), generator=gen).tolist(), completion_mask=[1] * 5,
                        old_logprobs=[-3.0] * 5, reward=float(i % 2), advantage=1.0 if i % 2 else -1.0,
                        policy_version=0, retokenized=False) for i in range(4)]
    metrics, weights = [], []
    for ckpt in (False, True):
        algo = GRPO(learning_rate=1e-3, bf16=False, gradient_checkpointing=ckpt)
        algo.setup(model_path=tiny, output_dir=tmp_path / str(ckpt), seed=0)
        assert checkpointing_on(algo.model) is ckpt
        metrics.append(algo.update(copy.deepcopy(batch)))
        weights.append({k: v.clone() for k, v in algo.model.state_dict().items()})
    assert metrics[1]["charts/grad_norm"] == pytest.approx(metrics[0]["charts/grad_norm"], rel=1e-4)
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, rtol=1e-4, atol=1e-6)
