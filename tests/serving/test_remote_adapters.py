"""Per-agent LoRA policies served by a policy server the Trainer did not start (``serving.urls``): the Trainer
adds its adapters there at start and pushes only the adapters after each update (``rollouts/policy_pool.py``);
the remote server then answers each adapter as the Trainer's own server does. Transformers backend here (the
remote is a real HTTP server in this process); ``test_vllm_remote_adapters.py`` runs the same on vLLM. One LoRA
policy (``algorithm.lora``) travels as its adapter alone too, served under the model's own name."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import spanrl
from spanrl.algorithms import GRPO, AgentPolicy
from spanrl.algorithms.lora import LoRAConfig
from spanrl.errors import ServingError
from spanrl.rollouts.policy_pool import ServingConfig
from spanrl.serving import PolicyServer, ServerConfig
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402

ADMIN, POLICY_TOKEN = "remote-admin", "remote-policy"
NAMES = ("writer", "checker", "default")


def two_agents(task: dict[str, Any], llm: LLMEndpoint) -> float:
    """A writer and a checker, each asking for its own adapter by name."""
    total = 0.0
    for name in ("writer", "checker"):
        with spanrl.agent(name):
            reply = llm.client().chat.completions.create(
                model=llm.model_for(name), messages=[{"role": "user", "content": task["question"]}], max_tokens=6,
                temperature=llm.sampling["temperature"])
            total += len(reply.choices[0].message.content or "") / 10
    return total


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's tokens: the remote's reload token (the Trainer sends it) and the collector's policy token."""
    monkeypatch.setenv("SPANRL_POLICY_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("SPANRL_COLLECTOR_POLICY_TOKEN", POLICY_TOKEN)


def remote_server(model: Path, root: Path, collector_port: int, **fields: Any) -> PolicyServer:
    """``spanrl serve`` as a user starts it beside a run: reloads from under ``root``, spans to the collector."""
    config = ServerConfig(model=model, port=0, served_model_name="policy", service_name="remote-policy",
                          otlp_endpoint=f"127.0.0.1:{collector_port}", admin_token=ADMIN, checkpoint_root=root,
                          otlp_headers={"authorization": f"Bearer {POLICY_TOKEN}"}, **fields)
    return PolicyServer(config).start()


def trainer_on(model: Path, out: Path, remote: str, collector_port: int, **fields: Any) -> Trainer:
    config = TrainerConfig(output_dir=str(out), n_rollouts=2, tasks_per_step=2, max_steps=1, eval_at_start=False,
                           progress=False, torch_threads=1, runner=RunnerConfig(max_concurrency=4),
                           serving=ServingConfig(urls=(remote,), collector_port=collector_port), **fields)
    policies = {"writer": AgentPolicy(lora=LoRAConfig(r=4, alpha=8)), "checker": AgentPolicy(lora=LoRAConfig(r=2))}
    return Trainer(model=model, agent=two_agents, tasks=calculator.make_tasks(4, seed=1), config=config,
                   algorithm=GRPO(learning_rate=5e-2), policies=policies)


def lora_trainer(model: Path, out: Path, remote: str, collector_port: int, *, steps: int) -> Trainer:
    """A run of one LoRA policy (``algorithm.lora``) whose rollouts go to the remote server."""
    config = TrainerConfig(output_dir=str(out), n_rollouts=2, tasks_per_step=2, max_steps=steps, eval_at_start=False,
                           progress=False, torch_threads=1, serving=ServingConfig(urls=(remote,),
                                                                                  collector_port=collector_port))
    return Trainer(model=model, agent=two_agents, tasks=calculator.make_tasks(4, seed=1), config=config,
                   algorithm=GRPO(learning_rate=5e-2, lora=LoRAConfig(r=4)))


def greedy(root: str, model: str, key: str | None = None) -> tuple[list[int], list[float]]:
    body = {"model": model, "prompt": "what is 2 add 3 ?", "max_tokens": 6, "temperature": 0}
    headers = {"authorization": f"Bearer {key}"} if key else None  # the Trainer's own server takes the run's key
    reply = httpx.post(f"{root}/v1/completions", json=body, headers=headers, timeout=120)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    return choice["token_ids"], choice["token_logprobs"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def ports() -> int:
    """A free port for the Trainer's collector, named before the run: the remote server exports there."""
    return free_port()


def test_the_trainer_adds_and_pushes_its_adapters_to_a_remote_server(tiny_model: Path, tmp_path: Path, tokens: None,
                                                                     ports: int, one_torch_thread: None) -> None:
    remote = remote_server(tiny_model, tmp_path, ports)
    try:
        assert remote.adapters == {}  # started plain: the Trainer adds its adapters
        trainer = trainer_on(tiny_model, tmp_path / "run", remote.base_url, ports)
        with trainer:
            assert remote.adapters == {name: 0 for name in NAMES}
            before = {name: greedy(remote.base_url, name) for name in NAMES}
            row = trainer.train()[-1]
            embedded = trainer.server.embedded
            assert remote.adapters == embedded.adapters == {name: 1 for name in NAMES}
            after = {name: greedy(remote.base_url, name) for name in NAMES}
            own = {name: greedy(embedded.base_url, name, trainer._services.api_key) for name in NAMES}
            calls = trainer.collector.store.sql(
                "SELECT service_name, policy_version FROM spans "
                "WHERE completion_token_ids IS NOT NULL AND rollout_id <> ''"
            ).to_pylist()  # the rollouts' calls (this test's own greedy calls name no rollout)
        pushed = sorted(p.name for p in (tmp_path / "run" / "served-weights" / "adapters" / "writer").iterdir())
    finally:
        remote.shutdown()
    assert row["rollouts_ok"] == 4 and row["agents/writer/policy_version"] == 1
    assert len(calls) == 8 and {c["service_name"] for c in calls} == {"remote-policy"}  # every call on the remote
    assert {c["policy_version"] for c in calls} == {0}
    for name in NAMES:  # the remote serves the Trainer's adapter: the embedded server's tokens and log-probs
        assert after[name][0] == own[name][0]
        assert after[name][1] == pytest.approx(own[name][1], abs=1e-5)
    assert after["writer"][1] != pytest.approx(before["writer"][1], abs=1e-5)  # the update reached the remote
    assert pushed == ["v1"]  # the adapter's new version only; the folder of the one it replaced is gone


def test_a_remote_server_already_serving_an_adapter_is_refused(tiny_model: Path, tmp_path: Path, tokens: None,
                                                               ports: int, one_torch_thread: None) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "old-writer"
    get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_model)), LoraConfig(r=4)).save_pretrained(str(folder))
    remote = remote_server(tiny_model, tmp_path, ports, lora_modules={"writer": str(folder)})
    try:
        with pytest.raises(ServingError, match="'writer' on the policy server at .* serves that adapter already"):
            with trainer_on(tiny_model, tmp_path / "run", remote.base_url, ports):
                pass
        assert remote.adapters == {"writer": 0}  # left as it was
    finally:
        remote.shutdown()


def test_one_lora_policy_as_the_default_adapter_travels_alone(tiny_model: Path, tmp_path: Path, tokens: None,
                                                              ports: int, one_torch_thread: None) -> None:
    """One LoRA policy as the ``default`` per-agent adapter (``policies: {default: {lora: ...}}``): only it travels."""
    remote = remote_server(tiny_model, tmp_path, ports)
    try:
        config = TrainerConfig(output_dir=str(tmp_path / "run"), n_rollouts=2, tasks_per_step=2, max_steps=1,
                               eval_at_start=False, progress=False, torch_threads=1,
                               serving=ServingConfig(urls=(remote.base_url,), collector_port=ports))
        trainer = Trainer(model=tiny_model, agent=two_agents, tasks=calculator.make_tasks(4, seed=1), config=config,
                          algorithm=GRPO(learning_rate=5e-2), policies={"default": AgentPolicy(lora=LoRAConfig(r=4))})
        with trainer:
            row = trainer.train()[-1]
            assert remote.adapters == trainer.server.embedded.adapters == {"default": 1}
        pushed = sorted(p.name for p in (tmp_path / "run" / "served-weights").iterdir())
    finally:
        remote.shutdown()
    assert row["rollouts_ok"] == 4 and row["agents/default/transitions"] == 8  # both agents' calls
    assert pushed == ["adapters"]  # no model.safetensors: the base never travelled


def test_the_algorithms_one_lora_policy_travels_as_its_adapter_alone(tiny_model: Path, tmp_path: Path, tokens: None,
                                                                     ports: int, one_torch_thread: None) -> None:
    """``algorithm.lora``: the remote gets the adapter alone and answers the served model's own name with base +
    adapter, at the policy version the Trainer's server has (which got the merged weights in memory)."""
    remote = remote_server(tiny_model, tmp_path, ports)
    served = tmp_path / "run" / "served-weights"
    try:
        with lora_trainer(tiny_model, tmp_path / "run", remote.base_url, ports, steps=2) as trainer:
            before = greedy(remote.base_url, "policy")
            rows = trainer.train()
            embedded = trainer.server.embedded
            after = greedy(remote.base_url, "policy")
            own = greedy(embedded.base_url, "policy", trainer._services.api_key)
            versions = (remote.version, embedded.version, remote.adapters)
        pushed = sorted(str(p.relative_to(served)) for p in served.rglob("*"))
    finally:
        remote.shutdown()
    assert [row["rollouts_ok"] for row in rows] == [4, 4]
    assert versions == (2, 2, {})  # counted as whole-weight reloads; no named adapter appeared
    assert pushed == ["lora", "lora/v2", "lora/v2/adapter_config.json", "lora/v2/adapter_model.safetensors"]
    assert after[0] == own[0] and after[1] == pytest.approx(own[1], abs=1e-5)  # base + adapter = the merged model
    assert after[1] != pytest.approx(before[1], abs=1e-5)  # the update reached the remote
