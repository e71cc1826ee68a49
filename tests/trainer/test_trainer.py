"""The Trainer loop end to end on a tiny model: real collector, policy server, agent processes, DuckDB,
decomposer, GRPO. Resume continues the same run; crashing and hanging agents do not stop training."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from spanrl.algorithms import GRPO, LightningRL
from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig
from spanrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CALCULATOR = REPO / "examples" / "calculator"
sys.path.insert(0, str(CALCULATOR))

import calculator  # noqa: E402

# A jsonl worker around the calculator agent, without opentelemetry-instrument (it configures spanrl
# itself: faster start-up). The task's "chaos" field makes it crash (the whole worker process dies) or
# hang on every attempt, or only on the first one.
_CHAOS_WORKER = textwrap.dedent(
    f"""
    import json, os, sys, time
    sys.path.insert(0, {str(CALCULATOR)!r})
    import openai
    from spanrl.instrumentation import configure, rollout
    from agent import run_rollout
    provider = configure()
    for line in sys.stdin:
        job = json.loads(line)
        chaos, first = job["task"].get("chaos"), job["attempt"] == 1
        if chaos == "crash" or (chaos == "crash_first" and first):
            os._exit(7)
        if chaos == "hang" or (chaos == "hang_first" and first):
            time.sleep(600)
        client = openai.OpenAI(base_url=job["base_url"], api_key=job["api_key"], max_retries=0)
        with rollout(job["rollout_id"], task_id=job["task_id"], attempt=job["attempt"], mode=job["mode"]):
            run_rollout(client, job["task"], model=job["model"], sampling=job["sampling"])
        provider.force_flush()
        print(json.dumps({{"spanrl_done": job["rollout_id"]}}), flush=True)
    """
)


def _chaos_agent(tmp_path: Path) -> list[str]:
    script = tmp_path / "chaos_worker.py"
    script.write_text(_CHAOS_WORKER)
    return [sys.executable, str(script)]


def _config(out: Path, **fields: Any) -> TrainerConfig:
    runner = RunnerConfig(workers=2, max_concurrency=4, instrument=False, rollout_timeout_s=30.0, span_timeout_s=10.0)
    base: dict[str, Any] = dict(
        output_dir=str(out), n_rollouts=4, tasks_per_step=2, max_steps=2, temperature=1.0, max_tokens=8,
        eval_at_start=False, progress=False, torch_threads=1, runner=runner,
    )
    base.update(fields)
    return TrainerConfig(**base)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_resume_continues_the_same_run(tiny_model: Path, tmp_path: Path) -> None:
    tasks, val = calculator.split_tasks(40, 4, seed=3)
    out = tmp_path / "run"

    def trainer(max_steps: int, resume: bool) -> Trainer:
        return Trainer(
            model=tiny_model, agent=_chaos_agent(tmp_path), tasks=tasks, val_tasks=val,
            algorithm=GRPO(learning_rate=5e-4), credit=LightningRL(baseline="grpo"),
            config=_config(out, max_steps=max_steps, save_every=1, resume=resume),
        )

    first = trainer(2, resume=False).train()
    assert [row["step"] for row in first] == [1, 2]
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    from training_checks import val_success_in_store

    assert first[-1]["val_success"] == val_success_in_store(out / "spans.duckdb", 2, len(val))

    second = trainer(3, resume=True)
    history = second.train()
    assert second.step == 3
    # the same run: the two steps already done are kept, exactly one more step ran, from checkpoint-2
    assert [row["step"] for row in history] == [1, 2, 3]
    assert history[:2] == json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["history"]
    assert (out / "checkpoint-3").is_dir()
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["step"] == 3 and len(state["history"]) == 3
    # step 3 sampled the tasks a fresh run would have sampled at step 3 (task order is resumable)
    rollouts = _read_jsonl(out / "rollouts.jsonl")
    assert sum(1 for r in rollouts if r["status"] == "ok" and r["mode"] == "train") == 3 * 2 * 4
    assert (out / "reward_curve.png").stat().st_size > 1000
    assert (out / "config.json").is_file() and (out / "spans.duckdb").is_file()


@pytest.mark.slow
def test_crashing_and_hanging_agents_do_not_stop_training(tiny_model: Path, tmp_path: Path) -> None:
    tasks = calculator.make_tasks(3, seed=5)
    tasks[0]["chaos"] = "crash"  # every attempt kills the worker: excluded after max_attempts
    tasks[1]["chaos"] = "hang_first"  # first attempt hangs past the timeout, the retry succeeds
    # the timeout also covers a restarted worker's imports (seconds on a loaded machine): not too tight
    runner = RunnerConfig(workers=2, max_concurrency=4, instrument=False, rollout_timeout_s=15.0, span_timeout_s=10.0,
                          max_attempts=2)
    out = tmp_path / "chaos"
    trainer = Trainer(
        model=tiny_model, agent=_chaos_agent(tmp_path), tasks=tasks,
        algorithm=GRPO(learning_rate=5e-4), credit=LightningRL(baseline="grpo"),
        config=_config(out, n_rollouts=2, tasks_per_step=3, max_steps=2, runner=runner),
    )
    history = trainer.train()
    assert [row["step"] for row in history] == [1, 2]
    for row in history:
        assert row["rollouts_ok"] == 4  # the normal task's 2 and the hanging task's 2 retries
        assert row["rollouts_failed"] >= 6  # crash x2 attempts x2 rollouts, hang x1 attempt x2 rollouts
        assert row["transitions"] == 4
    assert history[-1]["policy_version"] == 2  # both steps updated and pushed weights to the server
    statuses = {(r["task_id"], r["attempt"], r["status"]) for r in _read_jsonl(out / "rollouts.jsonl")}
    assert (tasks[0]["id"], 2, "crashed") in statuses
    assert (tasks[1]["id"], 1, "timeout") in statuses
    assert (tasks[1]["id"], 2, "ok") in statuses
    crashed = next(r for r in _read_jsonl(out / "rollouts.jsonl") if r["status"] == "crashed")
    assert "exited with code 7" in crashed["error"]


@pytest.mark.slow
def test_a_time_budget_makes_the_step_under_way_the_last(tiny_model: Path, tmp_path: Path) -> None:
    """max_minutes: the step that runs past the budget is the run's last, evaluated and saved as the
    max_steps-th would be; no further step starts."""
    tasks, val = calculator.split_tasks(40, 2, seed=3)
    out = tmp_path / "run"
    history = Trainer(model=tiny_model, agent=_chaos_agent(tmp_path), tasks=tasks, val_tasks=val,
                      algorithm=GRPO(learning_rate=5e-4), config=_config(out, max_steps=50, max_minutes=1e-6)).train()
    assert [row["step"] for row in history] == [1] and "val_success" in history[0]
    assert (out / "checkpoint-1" / "trainer_state.json").is_file()
    with pytest.raises(ConfigError, match="max_minutes must be a positive number of minutes or None, got 0"):
        TrainerConfig(max_minutes=0).validate()


def test_trainer_rejects_bad_config(tiny_model: Path, tmp_path: Path) -> None:
    tasks = calculator.make_tasks(4)
    with pytest.raises(ConfigError, match="n_rollouts must be a positive integer, got 0"):
        TrainerConfig(n_rollouts=0).validate()
    with pytest.raises(ConfigError, match="report_to entries must be one of"):
        TrainerConfig(report_to=("mlflow",)).validate()
    with pytest.raises(ConfigError, match=r"tasks_per_step \(8\) is larger than the number of tasks \(4\)"):
        Trainer(model=tiny_model, agent="python a.py", tasks=tasks, algorithm=GRPO(), tasks_per_step=8)
    with pytest.raises(ConfigError, match="model must be a Hugging Face model folder"):
        Trainer(model=tmp_path / "nope", agent="python a.py", tasks=tasks, algorithm=GRPO())
    with pytest.raises(ConfigError, match="task id 'x' appears twice"):
        Trainer(model=tiny_model, agent="python a.py", tasks=[{"id": "x"}, {"id": "x"}], algorithm=GRPO(),
                tasks_per_step=1)
    with pytest.raises(ConfigError, match="algorithm must be an Algorithm"):
        Trainer(model=tiny_model, agent="python a.py", tasks=tasks, algorithm="grpo", tasks_per_step=1)
    with pytest.raises(ConfigError,
                       match=r"temperature 0.7 \(the rollouts'\) differs from the algorithm's temperature 1.0"):
        Trainer(model=tiny_model, agent="python a.py", tasks=tasks, algorithm=GRPO(),
                config=TrainerConfig(temperature=0.7, tasks_per_step=1))
    with pytest.raises(ConfigError, match="LightningRL got an unknown field"):
        LightningRL(gama=0.9)


def test_the_trainers_policy_server_takes_only_its_per_run_key(tiny_model: Path, tmp_path: Path) -> None:
    """Issue 53, finding 3: the Trainer's server took calls from anyone who could reach it, so another local
    process could name (and join) the run's rollouts. It now makes one API key per run, in memory, and hands it
    to the agents it starts (``llm.api_key``, ``OPENAI_API_KEY``; the jsonl agent above sends ``job["api_key"]``)."""
    import httpx

    seen: list[tuple[int, int]] = []

    def agent(task: dict[str, Any], llm: Any) -> float:
        body = {"model": llm.model, "messages": [{"role": "user", "content": "1 add 2"}], "max_tokens": 2}
        keyless = httpx.post(f"{llm.base_url}/chat/completions", json=body, timeout=60)
        keyed = httpx.post(f"{llm.base_url}/chat/completions", json=body, timeout=60,
                           headers={"authorization": f"Bearer {llm.api_key}"})
        seen.append((keyless.status_code, keyed.status_code))
        return 1.0

    tasks, _ = calculator.split_tasks(8, 0, seed=3)
    with Trainer(model=tiny_model, agent=agent, tasks=tasks, algorithm=GRPO(learning_rate=5e-4),
                 credit=LightningRL(baseline="grpo"), config=_config(tmp_path / "run", max_steps=1)) as trainer:
        trainer.train()
        assert trainer.server is not None  # the with block keeps the run's (keyed) server up
        client = trainer.deploy()  # so deploy() hands out the run's key: it sent "spanrl" and got 401
        reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "1 add 2"}],
                                               max_tokens=2)
        assert reply.choices[0].message is not None
    assert seen and set(seen) == {(401, 200)}
