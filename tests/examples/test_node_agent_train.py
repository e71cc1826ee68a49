"""The Node.js agent trained end to end: the Trainer runs it as a command-line agent, its OTLP spans and
reward and the policy server's spans go through the collector into DuckDB, become transitions, and one
GRPO update changes the served policy (its log-probs become the checkpoint's)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from spanrl.algorithms import GRPO, LightningRL
from spanrl.trainer import Trainer, TrainerConfig
from spanrl.demo.tiny import build_tiny_model
from spanrl.store import SpanStore
from training_checks import assert_served_policy_changed, assert_trained, prime_half_right

NODE_AGENT = Path(__file__).resolve().parents[2] / "examples" / "node-agent"
_NUMBERS = [str(i) for i in range(11)]


def _messages(task: dict) -> list[dict[str, str]]:
    """What agent.js sends."""
    return [{"role": "system", "content": "You are a calculator. Answer with the number only."},
            {"role": "user", "content": task["question"]}]


@pytest.fixture(scope="module")
def node_agent() -> Path:
    if shutil.which("node") is None:
        pytest.skip("node is not installed (the Node.js agent needs Node >= 20)")
    if not (NODE_AGENT / "node_modules" / "@opentelemetry" / "sdk-node").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_AGENT, check=True,
                       timeout=300)
    return NODE_AGENT / "agent.js"


@pytest.mark.slow
def test_trainer_trains_the_node_agent(node_agent: Path, tmp_path: Path) -> None:
    words = [*_NUMBERS, "add", "You", "are", "a", "calculator.", "Answer", "with", "the", "number", "only."]
    model = build_tiny_model(tmp_path / "tiny", words=words, hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64)
    tasks = [{"id": f"add-{a}-{b}", "question": f"{a} add {b}", "answer": a + b} for a in range(3) for b in range(3)]
    # the right sum or the next number with odds ~1/2 each, so a group of 8 has unequal rewards
    prime_half_right(model, [(_messages(t), str(t["answer"]), str(t["answer"] + 1)) for t in tasks])
    trainer = Trainer(
        model=model, agent=["node", str(node_agent)], tasks=tasks, val_tasks=tasks[:2],
        algorithm=GRPO(learning_rate=5e-4), credit=LightningRL(),
        config=TrainerConfig(
            output_dir=str(tmp_path / "run"), n_rollouts=8, tasks_per_step=2, max_steps=1, max_tokens=4,
            eval_at_start=False, progress=False, torch_threads=1,
        ),
    )
    trainer.start()  # so train() leaves the server up, to be asked after its reload
    try:
        history = trainer.train()
        assert_served_policy_changed(trainer.deploy(), _messages(tasks[0]), initial=model,
                                     checkpoint=tmp_path / "run" / "checkpoint-1")
    finally:
        trainer.close()
    step = history[0]
    assert step["rollouts_ok"] == 16 and step["transitions"] == 16
    assert step["policy_version"] == 1  # the update reached the server
    assert_trained(step, initial=model, checkpoint=tmp_path / "run" / "checkpoint-1")

    store = SpanStore.open(tmp_path / "run" / "spans.duckdb", read_only=True)
    try:
        rows = store.sql(
            "SELECT rollout_id, list(DISTINCT service_name ORDER BY service_name) AS services,"
            " count(*) FILTER (WHERE reward_value IS NOT NULL) AS rewards,"
            " count(*) FILTER (WHERE completion_token_ids IS NOT NULL) AS exact_calls"
            " FROM spans WHERE mode = 'train' OR mode IS NULL GROUP BY rollout_id HAVING rewards > 0"
        ).to_pylist()
    finally:
        store.close()
    assert len(rows) == 16, json.dumps(rows)
    for row in rows:
        assert "agent" in row["services"]  # the JavaScript agent's own spans, named by the Trainer after agent.js
        assert row["rewards"] == 1 and row["exact_calls"] == 1
