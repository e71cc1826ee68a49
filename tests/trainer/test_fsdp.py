"""FSDP2 under ``accelerate launch`` (2 CPU processes, gloo): each rank holds half the model and optimizer
state, the update equals the one-process update, and the full weights reach the server and the checkpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from spanrl.algorithms import GRPO
from spanrl.algorithms.lora import LoRAConfig
from spanrl.errors import ConfigError
from spanrl.trainer import Trainer
from spanrl.demo.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("fsdp_train.py")
CONFIG = Path(__file__).with_name("fsdp_cpu.yaml")
ACCELERATE = Path(sys.executable).with_name("accelerate")
LAUNCH_TIMEOUT_S = 200


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(args: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_FSDP"):
        env.pop(name, None)
    if args[0] == "replay":
        command = [sys.executable, str(SCRIPT), *args]
    else:
        command = [str(ACCELERATE), "launch", "--config_file", str(CONFIG), "--main_process_port", str(_free_port()),
                   str(SCRIPT), *args]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]


def _max_relative_difference(a: dict, b: dict) -> float:
    """Largest |a - b| / max|b| over the tensors of two state dicts (same keys)."""
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max() / b[k].float().abs().max().clamp(min=1e-12)) for k in a)


@pytest.mark.parametrize(
    ("variables", "lora", "why"),
    [
        ({"FSDP_VERSION": "1"}, False, r"fsdp_version is 1; set fsdp_version: 2"),
        ({"FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"}, False, r"fsdp_offload_params: true is not supported"),
        ({"FSDP_VERSION": "2"}, True, r"LoRA adapters are not sharded"),
    ],
)
def test_fsdp_configs_it_cannot_honour_are_refused_before_any_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variables: dict, lora: bool, why: str
) -> None:
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    model = build_tiny_model(tmp_path / "tiny", words=["a", "b"], hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64)
    algorithm = GRPO(lora=LoRAConfig()) if lora else GRPO()
    (tmp_path / "a.py").write_text("")  # an agent that exists: the preflight checks it before the algorithm's refusal
    trainer = Trainer(model=model, agent=f"python {tmp_path / 'a.py'}", tasks=[{"id": "a"}], tasks_per_step=1,
                      algorithm=algorithm, output_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=rf"GRPO cannot train under accelerate's FSDP configuration .*{why}"):
        trainer.start()
    assert not (tmp_path / "run" / "rollouts.jsonl").exists() and trainer.server is None


@pytest.mark.slow
def test_fsdp_shards_and_updates_exactly_like_one_process(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(REPO / "examples" / "calculator"))
    import calculator

    model = build_tiny_model(
        tmp_path / "tiny", words=calculator.vocabulary(), hidden_size=32, num_layers=1, num_heads=2,
        intermediate_size=64
    )
    out = tmp_path / "out"
    out.mkdir()
    _launch(["train", str(model), str(out)])
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["world"], r["sharded"]) for r in ranks] == [(2, True), (2, True)]
    history = ranks[0]["history"]
    assert [row["step"] for row in history] == [1] and history[0]["transitions"] == 5
    assert ranks[1]["history"] == []  # only rank 0 records
    assert sorted(p.name for p in (out / "run").glob("checkpoint-*")) == ["checkpoint-1"]

    _launch(["replay", str(model), str(out)])
    replay = json.loads((out / "replay.json").read_text())
    assert (replay["rows"], replay["padding"]) == (5, 1)
    # Each rank holds about half of the parameters and of Adam's state (FSDP2 pads dim 0 to a multiple of 2).
    for key in ("params", "optimizer"):
        full = replay[key]
        assert all(r[key] <= 0.55 * full for r in ranks), (key, [r[key] for r in ranks], full)
        assert sum(r[key] for r in ranks) >= full, (key, [r[key] for r in ranks], full)

    one, two = replay["metrics"], history[0]
    assert two["charts/transitions"] == one["charts/transitions"] == 5.0
    assert two["charts/grad_norm"] == pytest.approx(one["charts/grad_norm"], rel=1e-5)
    assert two["losses/policy_loss"] == pytest.approx(one["losses/policy_loss"], rel=1e-5, abs=1e-7)
    assert two["charts/reward_mean"] == pytest.approx(one["charts/reward_mean"], rel=1e-6)
    assert two["losses/approx_kl"] == pytest.approx(one["losses/approx_kl"], rel=1e-4, abs=1e-7)

    after_one = torch.load(out / "replay.pt", weights_only=False)["weights"]
    rank0 = torch.load(out / "rank0.pt", weights_only=False)
    checkpoint = out / "run" / "checkpoint-1"
    saved = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).state_dict()
    before = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict()
    # The same tolerance as the DDP test (Adam's first step on near-zero gradient components).
    for name, weights in (("gathered", rank0["weights"]), ("served", rank0["served"]), ("saved", saved)):
        assert _max_relative_difference(weights, after_one) <= 1e-3, name
        assert _max_relative_difference(weights, before) > 1e-4, f"{name}: the update did not change the weights"
    state = torch.load(next(checkpoint.glob("*.pt")), weights_only=False)
    optimizer_numel = sum(v.numel() for s in state["optimizer"]["state"].values() for v in s.values() if v.dim())
    assert optimizer_numel == replay["optimizer"]  # the checkpoint holds the full (gathered) optimizer state

    # Resume under FSDP: every rank reads checkpoint-1 and keeps its shard; what rank 0 gathers right after
    # loading is exactly what was saved (weights and AdamW state, step included); then step 2 trains.
    _launch(["resume", str(model), str(out)])
    resumed = torch.load(out / "resume.pt", weights_only=False)
    assert _max_relative_difference(resumed["weights"], saved) == 0.0
    loaded = resumed["optimizer"]["state"]
    assert loaded.keys() == state["optimizer"]["state"].keys()
    for name, entry in state["optimizer"]["state"].items():
        assert all(torch.equal(loaded[name][key], value) for key, value in entry.items()), name
    assert [row["step"] for row in resumed["history"]] == [1, 2] and resumed["history"][1]["transitions"] == 5
    assert _max_relative_difference(resumed["after"], saved) > 1e-4  # step 2 moved the weights
