"""Per-agent LoRA policies on one base (``MultiLoRA``): a call trains its own agent's adapter only, each adapter
has its own optimizer, and a checkpoint of PEFT adapter folders resumes exactly."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from spanrl.algorithms.lora import LoRAConfig
from spanrl.algorithms.policies import AgentPolicy, MultiLoRA, MultiLoRAConfig, per_agent
from spanrl.algorithms.transitions import Transition
from spanrl.demo.tiny import build_tiny_model
from spanrl.errors import ConfigError

_WORDS = [str(i) for i in range(20)] + ["add", "is"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("base") / "tiny", words=_WORDS, hidden_size=32, num_layers=1,
                            num_heads=2, intermediate_size=64)


def _algo(model_path: Path, out: Path, **fields) -> MultiLoRA:
    policies = {"writer": AgentPolicy(lora=LoRAConfig(r=4)), "checker": AgentPolicy(lora=LoRAConfig(r=2),
                                                                                    learning_rate=1e-2)}
    algo = MultiLoRA(MultiLoRAConfig(policies=policies, learning_rate=1e-2, **fields))
    algo.setup(model_path=model_path, output_dir=out, seed=0)
    return algo


def _calls(agents: list[str | None], seed: int) -> list[Transition]:
    rng = random.Random(seed)
    out = []
    for i, agent in enumerate(agents):
        completion = [rng.randrange(5, 25) for _ in range(4)]
        out.append(Transition(rollout_id=f"r{i}", task_id="t", attempt=1, agent=agent, step=0,
                              prompt_ids=[rng.randrange(5, 25) for _ in range(5)], completion_ids=completion,
                              completion_mask=[1] * 4, old_logprobs=[], reward=float(i % 2),
                              advantage=1.0 if i % 2 else -1.0, policy_version=0, retokenized=False))
    return out


def _weights(algo: MultiLoRA, name: str) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in algo.adapter_state(name).items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_call_of_one_agent_never_updates_another_agents_adapter(model_path, tmp_path):
    algo = _algo(model_path, tmp_path)
    assert algo.names == ["writer", "checker", "default"]
    before = {n: _weights(algo, n) for n in algo.names}
    metrics = algo.update(_calls(["writer"] * 4, seed=1))
    after = {n: _weights(algo, n) for n in algo.names}
    assert not _same(before["writer"], after["writer"])
    assert _same(before["checker"], after["checker"]) and _same(before["default"], after["default"])
    assert metrics["agents/writer/transitions"] == 4 and "agents/checker/transitions" not in metrics

    # an unnamed agent's calls and calls of no agent go to the default adapter, and only there
    algo.update(_calls(["planner", None, "planner", None], seed=2))
    latest = {n: _weights(algo, n) for n in algo.names}
    assert not _same(after["default"], latest["default"])
    assert _same(after["writer"], latest["writer"]) and _same(after["checker"], latest["checker"])

    metrics = algo.update(_calls(["writer", "checker", "writer", "checker"], seed=3))
    counted = {k for k in metrics if k.startswith("agents/") and k.endswith("/transitions")}
    assert counted == {"agents/writer/transitions", "agents/checker/transitions"}
    assert algo.optimizers["checker"].param_groups[0]["lr"] == 1e-2


def test_each_adapter_is_a_peft_folder_the_server_can_load(model_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    algo = _algo(model_path, tmp_path)
    algo.update(_calls(["checker"] * 2, seed=4))
    algo.save(tmp_path / "ckpt")
    folder = tmp_path / "ckpt" / "adapters" / "checker"
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(model_path)), str(folder))
    from peft import get_peft_model_state_dict

    assert _same(get_peft_model_state_dict(loaded), _weights(algo, "checker"))
    assert set(algo.serving_adapters) == {"writer", "checker", "default"}


def test_resume_continues_every_adapter_exactly(model_path, tmp_path):
    first = _algo(model_path, tmp_path / "a")
    first.update(_calls(["writer", "checker", "writer", None], seed=5))
    first.save(tmp_path / "ckpt")
    resumed = _algo(model_path, tmp_path / "b")
    resumed.load_state(tmp_path / "ckpt")
    assert resumed.step == 1
    assert resumed.serving_adapters["writer"] == tmp_path / "ckpt" / "adapters" / "writer"
    batch = _calls(["checker", "writer", "writer", "checker"], seed=6)
    first.update(batch)
    resumed.update(batch)
    for name in first.names:  # same adapters and same optimizer moments: the same next step
        assert _same(_weights(first, name), _weights(resumed, name)), name


def test_resume_refuses_other_policies(model_path, tmp_path):
    first = _algo(model_path, tmp_path / "a")
    first.save(tmp_path / "ckpt")
    other = MultiLoRA(MultiLoRAConfig(policies={"solo": AgentPolicy()}))
    other.setup(model_path=model_path, output_dir=tmp_path / "b", seed=0)
    with pytest.raises(Exception, match="holds the policies"):
        other.load_state(tmp_path / "ckpt")


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="policies.writer.rank is not a policy setting"):
        MultiLoRAConfig(policies={"writer": {"rank": 4}}).validate()
    with pytest.raises(ConfigError, match="policies.writer.lora.rank is not a LoRA setting"):
        MultiLoRAConfig(policies={"writer": {"lora": {"rank": 4}}}).validate()
    with pytest.raises(ConfigError, match="not an agent name"):
        MultiLoRAConfig(policies={"a b": {}}).validate()
    with pytest.raises(ConfigError, match="GRPO"):
        from spanrl.algorithms.sft import SFT

        per_agent(SFT(), {"writer": {}})
    from spanrl.algorithms.grpo import GRPO

    # GRPO settings the per-agent loss does not take are refused, not dropped (Dr. GRPO's loss, a KL term)
    with pytest.raises(ConfigError, match=r"^policies: per-agent adapters train with their own GRPO loss, which takes "
                                          r".*; it would ignore beta=0.1, loss_type='dr_grpo', preset='dr_grpo': "
                                          r"remove them, or train without policies$"):
        per_agent(GRPO(preset="dr_grpo", beta=0.1), {"writer": {}})
    assert per_agent(GRPO(learning_rate=1e-3, micro_batch_size=2), {"writer": {}}).config.learning_rate == 1e-3
    config = MultiLoRAConfig(policies={"writer": {"lora": {"r": 2}, "reward_name": "ok"}}).validate()
    assert config.policies["writer"].lora.r == 2 and set(config.policies) == {"writer", "default"}


def test_train_config_policies_build_per_agent_adapters(model_path, tmp_path):
    from spanrl.trainer.train_config import build_trainer

    raw = {"model": str(model_path), "agent": ["python", "agent.py"], "tasks": [{"question": "1 add 2"}],
           "algorithm": {"name": "grpo", "learning_rate": 1e-3, "epsilon": 0.3},
           "policies": {"writer": {"lora": {"r": 4}}, "checker": {"reward_name": "caught"}},
           "output_dir": str(tmp_path / "run"), "tasks_per_step": 1}
    trainer = build_trainer(raw, base=tmp_path)
    algo = trainer.algorithm
    assert isinstance(algo, MultiLoRA) and algo.names == ["writer", "checker", "default"]
    assert algo.config.learning_rate == 1e-3 and algo.config.epsilon == 0.3
    assert algo.config.policies["writer"].lora.r == 4 and algo.config.policies["checker"].reward_name == "caught"
    assert algo.rollout_models() == ("default", {"writer": "writer", "checker": "checker"})
    with pytest.raises(ConfigError, match="policies.checker.reward is not a policy setting"):
        build_trainer({**raw, "policies": {"checker": {"reward": "x"}}}, base=tmp_path)
    with pytest.raises(ConfigError, match="agent_name 'writer' trains one agent"):
        build_trainer({**raw, "agent_name": "writer"}, base=tmp_path)


def test_each_agent_has_its_own_model_variable(monkeypatch):
    from spanrl import env
    from spanrl.rollouts.rollouts import LLMEndpoint, RolloutSpec

    spec = RolloutSpec(rollout_id="r", task_id="t", task={}, attempt=1, mode="train", base_url="http://x/v1",
                       model="default", sampling={}, agent_models={"sql-writer": "sql-writer", "checker": "checker"})
    environ = spec.environ()
    assert environ["SPANRL_MODEL_SQL_WRITER"] == "sql-writer" and environ["SPANRL_MODEL_CHECKER"] == "checker"
    assert environ["SPANRL_MODEL"] == "default"
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert env.agent_model("sql-writer") == "sql-writer" and env.agent_model("planner") == "default"
    llm = LLMEndpoint(base_url="http://x/v1", model="default", agent_models={"checker": "checker"})
    assert llm.model_for("checker") == "checker" and llm.model_for("planner") == "default"
