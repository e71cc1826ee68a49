"""The Trainer with each kind of algorithm, end to end on a tiny model (real collector, policy server,
DuckDB, decomposer): GRPO with LoRA, PPO with its critic and GAE, APO on prompt templates; and the
in-process tracing a callable agent gets."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from spanrl.algorithms import APO, GRPO, PPO
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig
from spanrl.algorithms.lora import LoRAConfig
from spanrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "calculator"))
sys.path.insert(0, str(REPO / "tests"))

import calculator  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

HINTS = ["Think step by step.", "Answer with a number only.", "Check your arithmetic."]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _calculator_agent(task: dict[str, Any], llm: LLMEndpoint) -> float:
    """The calculator task through the policy server; the returned reward is emitted by the runner."""
    reply = llm.client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8,
        temperature=llm.sampling["temperature"],
    )
    return calculator.reward(task, calculator.parse_call(reply.choices[0].message.content or ""))


def _config(out: Path, **fields: Any) -> TrainerConfig:
    base: dict[str, Any] = dict(
        output_dir=str(out), n_rollouts=3, tasks_per_step=2, max_steps=1, eval_at_start=False, progress=False,
        torch_threads=1, runner=RunnerConfig(max_concurrency=3),
    )
    base.update(fields)
    return TrainerConfig(**base)


@pytest.mark.slow
def test_lora_policy_reloads_into_the_server(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    def agent(task: dict[str, Any], llm: LLMEndpoint) -> float:
        reply = llm.client().chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8, temperature=1.0
        )
        return len(reply.choices[0].message.content or "") / 10  # varies between samples: a gradient to follow

    trainer = Trainer(
        model=tiny_model, agent=agent, tasks=calculator.make_tasks(4, seed=1),
        algorithm=GRPO(learning_rate=5e-2, lora=LoRAConfig(r=4, alpha=8)), config=_config(tmp_path / "run"),
    )
    history = trainer.train()
    row = history[-1]
    assert row["rollouts_ok"] == 6 and row["transitions"] == 6
    assert row["policy_version"] == 1  # the reload was accepted
    # the decomposer's data-quality counts are logged with the step
    assert row["transitions_report"]["transitions"] == 6 and row["transitions_report"]["skipped_no_ids"] == 0
    logged = json.loads((tmp_path / "run" / "history.jsonl").read_text().splitlines()[-1])
    assert logged["transitions_report"] == row["transitions_report"]
    client = trainer.deploy()  # the server still answers after the reload
    try:
        from training_checks import assert_served_policy_changed

        # its log-probs are the merged checkpoint's, not the base model's
        assert_served_policy_changed(client, [{"role": "user", "content": "3 add 4"}],
                                     initial=tiny_model, checkpoint=tmp_path / "run" / "checkpoint-1")
        # it serves the trained policy: the adapter merged into the base weights, as the checkpoint holds them
        served = trainer.server._state.batcher.backend.model.state_dict()  # deploy() after close: a plain server
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint-1").state_dict()
        base = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
        assert all(torch.equal(served[k], merged[k]) for k in merged)
        assert not all(torch.equal(served[k], base[k]) for k in base)
    finally:
        trainer.close()
    assert (tmp_path / "run" / "checkpoint-1" / "adapters" / "default").is_dir()


@pytest.mark.slow
def test_ppo_trains_with_critic_values(tiny_model: Path, tmp_path: Path) -> None:
    def agent(task: dict[str, Any], llm: LLMEndpoint) -> float:
        llm.client().chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=4,
            temperature=llm.sampling["temperature"],
        )
        return 1.0 if task["a"] % 2 else 0.5  # the same reward for every rollout of a task

    trainer = Trainer(
        model=tiny_model, agent=agent, tasks=calculator.make_tasks(4, seed=2),
        algorithm=PPO(learning_rate=5e-3, gamma=1.0, lam=0.95), config=_config(tmp_path / "run", max_steps=2),
    )
    history = trainer.train()
    assert [row["step"] for row in history] == [1, 2]
    for row in history:
        assert row["transitions"] == 6 and row["transitions_report"]["transitions"] == 6
        assert row["losses/value_loss"] > 0 and "losses/policy_loss" in row
    first, second = history
    # GAE, not the group baseline (which gives 0 here: every rollout of a task has the same reward).
    # Step 1: the critic starts at V = 0, so one-call rollouts get A = r - V = r.
    assert first["advantage_mean"] == pytest.approx(first["reward_mean"])
    # Step 2: the critic was trained on step 1's returns, and its values moved the advantages
    assert abs(second["advantage_mean"] - second["reward_mean"]) > 1e-4
    assert second["policy_version"] == 2
    assert json.loads((tmp_path / "run" / "config.json").read_text())["algorithm"]["name"] == "PPO"


def _critic(body: dict[str, Any]) -> str:
    """A scripted critic: the critique names the first hint the template lacks, the edit appends it."""
    import re

    prompt = body["messages"][-1]["content"]
    template = re.search(r"<template>\n(.*?)\n</template>", prompt, re.DOTALL).group(1)
    missing = [h for h in HINTS if h not in template]
    if "Wrap your answer in <critique>" in prompt:
        return f"<critique>Add the instruction: {missing[0] if missing else 'nothing'}</critique>"
    hint = re.search(r"<critique>\n(.*?)\n</critique>", prompt,
                     re.DOTALL).group(1).removeprefix("Add the instruction: ")
    return f"<template>{template} {hint}</template>" if hint in HINTS else f"<template>{template}</template>"


@pytest.mark.slow
def test_apo_optimizes_the_template_the_agent_uses(tiny_model: Path, tmp_path: Path) -> None:
    seen: list[str | None] = []

    def agent(task: dict[str, Any], llm: LLMEndpoint) -> float:
        seen.append(llm.prompt_template)
        prompt = (llm.prompt_template or "{question}").format(question=task["question"])
        llm.client().chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": prompt}], max_tokens=2,
            temperature=llm.sampling["temperature"]
        )
        return sum(h in prompt for h in HINTS) / len(HINTS)  # the template decides the reward

    tasks = calculator.make_tasks(4, seed=3)
    with FakeOpenAI(reply=_critic) as critic:
        trainer = Trainer(
            model=tiny_model, agent=agent, tasks=tasks, val_tasks=tasks[:1],
            algorithm=APO(critic_base_url=critic.base_url, critic_model="scripted", beam_width=1, branch_factor=1,
                          rounds=3),
            prompt_template="Solve: {question}", config=_config(tmp_path / "run", n_rollouts=2),
        )
        history = trainer.train()
    best = "Solve: {question} " + " ".join(HINTS)
    assert trainer.prompt_template == best
    assert [row["reward_mean"] for row in history if "reward_mean" in row] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    assert history[-1]["apo/best_score"] == 1.0 and history[-1]["apo/initial_score"] == 0.0
    assert history[-1]["val_success"] == 1.0  # held-out rollouts ran with the best template
    saved = json.loads((tmp_path / "run" / "apo_result.json").read_text())
    assert saved["best_template"] == best and saved["best_score"] == 1.0
    assert set(seen) == {"Solve: {question}", *(("Solve: {question} " + " ".join(HINTS[:i])) for i in (1, 2, 3))}
    assert len(seen) == 4 * 2 * 2 + 1  # 4 templates x 2 tasks x 2 rollouts, then 1 validation rollout
    # the critic saw each template's failing outcomes (the task and its reward)
    assert "reward 0" in critic.requests[0].body["messages"][0]["content"]


def test_apo_needs_an_initial_template(tiny_model: Path) -> None:
    tasks = calculator.make_tasks(2)
    with pytest.raises(ConfigError, match="prompt_template must be the initial template when the algorithm is APO"):
        Trainer(model=tiny_model, agent=_calculator_agent, tasks=tasks, algorithm=APO(critic_base_url="http://x/v1"),
                tasks_per_step=1)
    with pytest.raises(ConfigError, match="resume must be False with APO"):
        Trainer(
            model=tiny_model, agent=_calculator_agent, tasks=tasks, algorithm=APO(critic_base_url="http://x/v1"),
            prompt_template="{question}", tasks_per_step=1, resume=True,
        )


@pytest.mark.slow
def test_in_process_agent_requests_carry_rollout_baggage(tiny_model: Path, tmp_path: Path) -> None:
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    from spanrl.instrumentation.instrumentor import SpanRLInstrumentor

    def agent(task: dict[str, Any], llm: LLMEndpoint) -> float:
        llm.client().chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
        return 1.0

    was = (OpenAIInstrumentor().is_instrumented_by_opentelemetry, SpanRLInstrumentor().is_instrumented_by_opentelemetry)
    # A fake in place of spanrl's policy server, for what only a fake can do: record each request's raw
    # HTTP headers (baggage, traceparent) as they arrived on the wire; the real server hands no request
    # headers back to a test.
    with FakeOpenAI(reply="<call> add 1 2 </call>") as llm:
        trainer = Trainer(
            model=tiny_model, agent=agent, tasks=calculator.make_tasks(2, seed=4), algorithm=GRPO(),
            config=_config(tmp_path / "run", llm_url=llm.url, tasks_per_step=1, n_rollouts=2),
        )
        results = trainer.collect(trainer.tasks[:1], n_rollouts=2)
        trainer.close()
    assert [r.status for r in results] == ["ok", "ok"]
    chats = [r for r in llm.requests if r.path.endswith("/chat/completions")]
    assert len(chats) == 2
    for request in chats:
        rollout_id = request.path.split("/rollouts/")[1].split("/")[0]
        assert f"spanrl.rollout.id={rollout_id}" in request.headers.get("baggage", "")
        assert "traceparent" in request.headers
    # closing the Trainer put both instrumentors back as it found them
    assert ((OpenAIInstrumentor().is_instrumented_by_opentelemetry,
             SpanRLInstrumentor().is_instrumented_by_opentelemetry) == was)
