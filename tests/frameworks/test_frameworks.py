"""The framework matrix: agents written with other frameworks, with NO spanrl in their environment, run
as the Trainer's command-line agent under their own venv's opentelemetry-instrument; their spans and the
policy server's reach the collector, and one GRPO step trains on their rows (a tiny model primed to answer
right about half the time, so rewards vary within each group of 8: the step's gradient and weights are checked).

Run with ``make test-frameworks`` (``pytest -m frameworks tests/frameworks``); the first run builds one
venv per framework (pip cache), later runs reuse it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from framework_venvs import AGENTS, FRAMEWORKS, HERE, framework_venv
from spanrl.algorithms import GRPO, LightningRL
from spanrl.store import SpanStore
from spanrl.store.decomposer import Selection, decompose
from spanrl.trainer import Trainer, TrainerConfig
from spanrl.rollouts.runner import RunnerConfig
from spanrl.demo.tiny import build_tiny_model
from training_checks import assert_trained, prime_half_right

pytestmark = [pytest.mark.frameworks, pytest.mark.slow]

_WORDS = [*(str(i) for i in range(11)), "add", "plus"]
_TASKS = [{"id": f"add-{a}-{b}", "question": f"{a} add {b}", "answer": a + b} for a in range(3) for b in range(3)]
_N_ROLLOUTS, _TASKS_PER_STEP = 8, 2
# What the agents send: the question alone, or after the Agents SDK's instructions. The right sum or the
# next number (no substring of it), odds ~1/2 each.
_PRIME = [(prefix + [{"role": "user", "content": t["question"]}], str(t["answer"]), str(t["answer"] + 1))
          for t in _TASKS for prefix in ([], [{"role": "system", "content": "Add the two numbers."}])]


def _train_one_step(name: str, tmp_path: Path, **runner: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    venv = framework_venv(name)
    model = build_tiny_model(tmp_path / "tiny", words=_WORDS, hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64)
    prime_half_right(model, _PRIME)
    agent = [str(venv / "bin" / "opentelemetry-instrument"), str(venv / "bin" / "python"),
             str(HERE / "agents" / f"{AGENTS.get(name, name)}.py")]
    trainer = Trainer(
        model=model, agent=agent, tasks=_TASKS, algorithm=GRPO(learning_rate=5e-4), credit=LightningRL(),
        config=TrainerConfig(
            output_dir=str(tmp_path / "run"), n_rollouts=_N_ROLLOUTS, tasks_per_step=_TASKS_PER_STEP, max_steps=1,
            max_tokens=4, eval_at_start=False, progress=False, torch_threads=1,
            runner=RunnerConfig(instrument=False, rollout_timeout_s=120, span_timeout_s=20, **runner),
        ),
    )
    try:
        history = trainer.train()
    finally:
        trainer.close()
    with SpanStore.open(tmp_path / "run" / "spans.duckdb", read_only=True) as store:
        rollouts = store.sql("SELECT * FROM rollouts WHERE mode = 'train' ORDER BY rollout_id").to_pylist()
        duplicates = decompose(store, Selection(mode="train")).report["duplicate_calls"]
    assert_trained(history[0], initial=model, checkpoint=tmp_path / "run" / "checkpoint-1")
    return {**history[0], "duplicate_calls": duplicates}, rollouts


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_framework_agent_trains_without_spanrl(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # opentelemetry-instrument puts the cwd on PYTHONPATH: not this checkout
    step, rollouts = _train_one_step(name, tmp_path)
    n = _N_ROLLOUTS * _TASKS_PER_STEP
    assert step["rollouts_ok"] == n, step
    assert step["transitions"] == n, step  # one call per rollout: no doubled or lost client span
    assert step["policy_version"] == 1  # the update reached the server
    # two instrumentors: each call's second client span is set aside and counted
    assert step["duplicate_calls"] == (n if name == "openai_v2_and_openllmetry" else 0)
    assert len(rollouts) == n
    for row in rollouts:
        assert (row["status"], row["ended_by"], row["reward_count"]) == ("finished", "agent_exit", 1), row
    assert {row["final_reward"] for row in rollouts} == {0.0, 1.0}
