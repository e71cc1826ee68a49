"""Two agents, two adapters, one run: a writer and a checker on a tiny model, end to end (real collector, policy
server serving both adapters, DuckDB, decomposer), then a resume of the same run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import spanrl
from spanrl.algorithms import GRPO
from spanrl.algorithms.lora import LoRAConfig
from spanrl.algorithms import AgentPolicy
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")


SEEN: list[tuple[str, str]] = []
CAUGHT: list[float] = []


def two_agents(task: dict[str, Any], llm: LLMEndpoint) -> float:
    """A writer answers, a checker reviews; each asks for its own adapter by name."""
    client, total = llm.client(), 0.0
    for name in ("writer", "checker"):
        with spanrl.agent(name):
            model = llm.model_for(name)
            SEEN.append((name, model))
            messages = [{"role": "user", "content": task["question"]}]
            reply = client.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                                   temperature=llm.sampling["temperature"])
            total += len(reply.choices[0].message.content or "") / 10  # varies between samples: a gradient
            if name == "checker":  # the checker's own reward: half its share of the rollout's
                CAUGHT.append(len(reply.choices[0].message.content or "") / 20)
                spanrl.emit_reward(CAUGHT[-1], name="caught")
    return total


def _trainer(tiny_model: Path, out: Path, **fields: Any) -> Trainer:
    base: dict[str, Any] = dict(output_dir=str(out), n_rollouts=3, tasks_per_step=2, max_steps=1, eval_at_start=False,
                                progress=False, torch_threads=1, runner=RunnerConfig(max_concurrency=3))
    config = TrainerConfig(**{**base, **fields})
    policies = {"writer": AgentPolicy(lora=LoRAConfig(r=4, alpha=8)), "checker": AgentPolicy(lora=LoRAConfig(r=2),
                                                                                   reward_name="caught")}
    return Trainer(model=tiny_model, agent=two_agents, tasks=calculator.make_tasks(4, seed=1), config=config,
                   algorithm=GRPO(learning_rate=5e-2), policies=policies)


def test_two_agents_train_their_own_adapters_and_resume(tiny_model: Path, tmp_path: Path) -> None:
    from peft.utils import load_peft_weights

    SEEN.clear()
    CAUGHT.clear()
    trainer = _trainer(tiny_model, tmp_path / "run")
    with trainer:
        initial = {n: trainer.algorithm.adapter_state(n) for n in ("writer", "checker")}
        initial = {n: {k: v.detach().clone() for k, v in s.items()} for n, s in initial.items()}
        history = trainer.train()
        served = trainer.server.embedded
        assert served.adapters == {"writer": 1, "checker": 1, "default": 1}  # each adapter reloaded once
        backend = served._state.batcher.backend
    row = history[-1]
    assert set(SEEN) == {("writer", "writer"), ("checker", "checker")}  # each agent asked for its adapter
    assert row["rollouts_ok"] == 6 and row["transitions"] == 12
    assert row["agents/writer/transitions"] == 6 and row["agents/checker/transitions"] == 6
    assert "agents/default/transitions" not in row  # no call went to the default policy
    # each agent's own credit: the checker's named reward, the writer's the rollout's
    assert row["agents/checker/reward_mean"] == pytest.approx(sum(CAUGHT) / len(CAUGHT))
    assert row["agents/writer/reward_mean"] == pytest.approx(row["reward_mean"])
    assert row["agents/checker/reward_mean"] != pytest.approx(row["reward_mean"])
    assert row["agents/writer/policy_version"] == 1 and row["agents/checker/policy_version"] == 1
    logged = json.loads((tmp_path / "run" / "history.jsonl").read_text().splitlines()[-1])
    assert logged["agents/checker/transitions"] == 6

    checkpoint = tmp_path / "run" / "checkpoint-1"
    for name in ("writer", "checker"):  # each adapter: a PEFT folder, trained, and what the server served
        saved = load_peft_weights(str(checkpoint / "adapters" / name), device="cpu")
        assert not all(torch.equal(saved[k], initial[name][k]) for k in saved), name
    assert backend.model is None  # the server was closed with the run
    del backend

    resumed = _trainer(tiny_model, tmp_path / "run", resume=True, max_steps=2)
    history = resumed.train()
    assert [r["step"] for r in history] == [1, 2]
    assert history[-1]["agents/writer/transitions"] == 6
    assert (tmp_path / "run" / "checkpoint-2" / "adapters" / "checker" / "adapter_config.json").is_file()

    client = resumed.deploy()  # the newest checkpoint: its base plus each adapter
    try:
        ids = [m.id for m in client.models.list().data]
        assert ids[1:] == ["checker", "default", "writer"]
    finally:
        resumed.close()
    _viewer_shows_each_agent(tmp_path / "run")


def _viewer_shows_each_agent(run: Path) -> None:
    """The viewer (``spanrl ui`` on the run): each call's agent and adapter with its version, a curve per agent."""
    import subprocess
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "spanrl", "ui", "--port", "0", "--db", str(run / "spans.duckdb"),
                             "--run", str(run)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = proc.stdout.readline().strip().rsplit(" open ", 1)[1].rstrip("/")  # type: ignore[union-attr]
        get = lambda path: json.loads(urllib.request.urlopen(url + path, timeout=60).read())  # noqa: E731
        runs = get("/api/runs")["runs"]
        assert {"agents/writer/reward_mean", "agents/checker/advantage_mean"} <= set(runs[0]["rows"][-1])
        rollout = get("/api/rollouts?mode=train")["rows"][0]
        assert rollout["agents"] == "checker, writer"
        calls = get(f"/api/rollout?id={rollout['rollout_id']}")["calls"]
        assert sorted((c["agent"], c["adapter"]) for c in calls) == [("checker", "checker"), ("writer", "writer")]
        assert all(c["policy_version"] is not None for c in calls)
    finally:
        proc.terminate()
        proc.wait(30)
