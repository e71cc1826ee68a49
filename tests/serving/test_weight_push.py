"""Whole weights sent to a policy server in a request's body (``POST /v1/weights/load``, one safetensors file,
loaded in memory): no folder on either side. Real servers on 127.0.0.1, transformers backend; the Trainer's
``serving.weights_transport: http`` pushes full fine-tuning's weights this way to a server started without a
``--checkpoint-root`` (it could read no folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save
from test_remote_adapters import ADMIN, POLICY_TOKEN, calculator, greedy, ports, tokens, two_agents  # noqa: F401

from spanrl.algorithms import GRPO
from spanrl.errors import ServingError
from spanrl.rollouts.policy_pool import ServingConfig
from spanrl.serving import PolicyServer, ServerConfig
from spanrl.serving.client import PolicyClient
from spanrl.trainer import Trainer, TrainerConfig


def server(model: Path, **fields: Any) -> PolicyServer:
    return PolicyServer(ServerConfig(model=model, port=0, served_model_name="policy", **fields)).start()


def other_weights(model: Path) -> dict[str, torch.Tensor]:
    """The model's weights moved by seeded noise: another policy of the same shape."""
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(str(model)).state_dict()
    generator = torch.Generator().manual_seed(0)
    return {k: (v + 0.05 * torch.randn(v.shape, generator=generator)).contiguous() for k, v in state.items()
            if k != "lm_head.weight" or v.data_ptr() != state["model.embed_tokens.weight"].data_ptr()}


def test_weights_in_the_body_replace_the_served_ones_and_bad_bodies_get_a_clear_4xx(
        tiny_model: Path, one_torch_thread: None) -> None:
    weights = other_weights(tiny_model)
    remote, reference = server(tiny_model, admin_token=ADMIN), server(tiny_model)
    small, closed = server(tiny_model, admin_token=ADMIN, max_weights_bytes=1000), server(tiny_model)
    try:
        before = greedy(remote.base_url, "policy")
        assert PolicyClient(remote.base_url, token=ADMIN).push(save(weights)) == 1 == remote.version
        reference.reload(weights)
        after, expected = greedy(remote.base_url, "policy"), greedy(reference.base_url, "policy")
        refusals = {}
        for name, (root, token, data) in {
            "no token": (remote.base_url, "wrong", save(weights)),
            "not safetensors": (remote.base_url, ADMIN, b"\x00" * 64),
            "wrong tensors": (remote.base_url, ADMIN, save({"x": torch.zeros(2)})),
            "too large": (small.base_url, ADMIN, save(weights)),
            "route off": (closed.base_url, ADMIN, save(weights)),
        }.items():
            with pytest.raises(ServingError) as caught:
                PolicyClient(root, token=token).push(data)
            refusals[name] = str(caught.value)
        versions = remote.version, small.version, closed.version
    finally:
        for s in (remote, reference, small, closed):
            s.shutdown()
    assert after == expected and after != before  # the pushed weights serve, as when loaded in process
    assert versions == (1, 0, 0)  # refused bodies change nothing
    assert "answered 401" in refusals["no token"] and "SPANRL_POLICY_ADMIN_TOKEN" in refusals["no token"]
    assert "answered 400" in refusals["not safetensors"] and "not a safetensors file" in refusals["not safetensors"]
    assert "answered 400" in refusals["wrong tensors"] and "unexpected ['x']" in refusals["wrong tensors"]
    assert "answered 413" in refusals["too large"] and "--max-weights-bytes" in refusals["too large"]
    assert "answered 403" in refusals["route off"] and "--admin-token-file" in refusals["route off"]


def test_the_trainer_sends_full_fine_tuning_weights_without_a_folder(tiny_model: Path, tmp_path: Path, tokens: None,
                                                                     ports: int, one_torch_thread: None) -> None:
    remote = server(tiny_model, admin_token=ADMIN, service_name="remote-policy",  # no --checkpoint-root: no folders
                    otlp_endpoint=f"127.0.0.1:{ports}", otlp_headers={"authorization": f"Bearer {POLICY_TOKEN}"})
    try:
        config = TrainerConfig(output_dir=str(tmp_path / "run"), n_rollouts=2, tasks_per_step=2, max_steps=2,
                               eval_at_start=False, progress=False, torch_threads=1,
                               serving=ServingConfig(urls=(remote.base_url,), collector_port=ports,
                                                     weights_transport="http"))
        with Trainer(model=tiny_model, agent=two_agents, tasks=calculator.make_tasks(4, seed=1), config=config,
                     algorithm=GRPO(learning_rate=5e-2)) as trainer:
            rows = trainer.train()
            after = greedy(remote.base_url, "policy")
            own = greedy(trainer.server.embedded.base_url, "policy", trainer._services.api_key)
            versions = remote.version, trainer.server.embedded.version
    finally:
        remote.shutdown()
    assert [row["rollouts_ok"] for row in rows] == [4, 4] and versions == (2, 2)
    assert not (tmp_path / "run" / "served-weights").exists()  # nothing written for the remote to read
    assert after[0] == own[0] and after[1] == pytest.approx(own[1], abs=1e-5)


def test_a_base_served_through_a_pushed_adapter_is_the_base_alone_again_after_whole_weights(
        tiny_model: Path, tmp_path: Path, one_torch_thread: None) -> None:
    """A reload of the base naming a PEFT adapter folder serves base + adapter under the model's name (how
    ``algorithm.lora`` travels); whole weights sent later replace both."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    peft = get_peft_model(base, LoraConfig(r=4, init_lora_weights=False))  # a LoRA that changes the outputs
    peft.save_pretrained(str(tmp_path / "lora"))
    merged = peft.merge_and_unload().state_dict()
    weights = other_weights(tiny_model)
    remote, reference = server(tiny_model, admin_token=ADMIN, checkpoint_root=tmp_path), server(tiny_model)
    try:
        client = PolicyClient(remote.base_url, token=ADMIN)
        assert client.reload(tmp_path / "lora") == 1 and remote.adapters == {}  # the base's, no named adapter
        reference.reload(merged)
        with_lora, merged_greedy = greedy(remote.base_url, "policy"), greedy(reference.base_url, "policy")
        assert client.push(save(weights)) == 2
        reference.reload(weights)
        whole, expected = greedy(remote.base_url, "policy"), greedy(reference.base_url, "policy")
    finally:
        remote.shutdown()
        reference.shutdown()
    assert with_lora[0] == merged_greedy[0] and with_lora[1] == pytest.approx(merged_greedy[1], abs=1e-5)
    assert whole[0] == expected[0] and whole[1] == pytest.approx(expected[1], abs=1e-6)  # the adapter no longer applies
