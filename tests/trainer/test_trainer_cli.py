"""`spanrl train CONFIG.yaml` and a Python callable agent: the same loop, other entry points."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from spanrl.algorithms import GRPO, LightningRL
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig
from spanrl.trainer._cli import build_trainer
from spanrl.cli import main
from spanrl.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
CALCULATOR = REPO / "examples" / "calculator"
sys.path.insert(0, str(CALCULATOR))

import calculator  # noqa: E402


def test_build_trainer_names_the_bad_setting(tiny_model: Path, tmp_path: Path) -> None:
    good: dict[str, Any] = {"model": str(tiny_model), "agent": "python a.py", "tasks": [{"id": "a"}, {"id": "b"}],
                            "tasks_per_step": 1}
    trainer = build_trainer({**good, "algorithm": {"name": "grpo", "learning_rate": 1e-4}, "runner": {"workers": 2}})
    assert trainer.algorithm.config.learning_rate == 1e-4 and trainer.config.runner.workers == 2
    apo = build_trainer({**good, "algorithm": {"name": "apo", "critic_base_url": "http://127.0.0.1:9/v1", "rounds": 2},
                         "prompt_template": "Q: {question}"})
    assert apo.prompt_template == "Q: {question}" and apo.algorithm.config.rounds == 2
    with pytest.raises(ConfigError, match="prompt_template must be the initial template when the algorithm is APO"):
        build_trainer({**good, "algorithm": {"name": "apo"}})
    with pytest.raises(ConfigError, match="algorithm.name must be one of"):
        build_trainer({**good, "algorithm": {"name": "reinforce"}})
    with pytest.raises(ConfigError, match="'n_rollout' is not a trainer setting"):
        build_trainer({**good, "n_rollout": 4})
    with pytest.raises(ConfigError, match="runner.worker is not a runner setting"):
        build_trainer({**good, "runner": {"worker": 2}})
    with pytest.raises(ConfigError, match="the train config needs 'agent'"):
        build_trainer({"model": str(tiny_model), "tasks": []})
    with pytest.raises(ConfigError, match=r"tasks: no such file"):
        build_trainer({**good, "tasks": "missing.jsonl"}, base=tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\nnot json\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2 is not JSON"):
        build_trainer({**good, "tasks": "bad.jsonl"}, base=tmp_path)


@pytest.mark.slow
def test_spanrl_train_from_yaml_then_resume(tiny_model: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    tasks, val = calculator.split_tasks(20, 4, seed=4)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (tmp_path / "val.json").write_text(json.dumps(val))
    (tmp_path / "train.yaml").write_text(
        f"""
model: {tiny_model}
agent: [{sys.executable}, {CALCULATOR / 'agent.py'}]
tasks: tasks.jsonl
val_tasks: val.json
algorithm: {{name: grpo, learning_rate: 5.0e-4}}
credit: {{mode: identical, baseline: rloo, trajectory_aggregation: true}}
output_dir: {tmp_path / 'run'}
n_rollouts: 2
tasks_per_step: 2
max_steps: 1
max_tokens: 8
save_every: 1
eval_at_start: false
progress: false
torch_threads: 1
report_to: [tensorboard]
runner: {{workers: 2, max_concurrency: 4}}
"""
    )
    assert main(["train", str(tmp_path / "train.yaml"), "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == f"full logs: {tmp_path / 'run' / 'spanrl.log'}"
    assert out[-2].startswith("done: 1 steps, reward ") and "held-out success" in out[-2]
    first = json.loads(out[-1])
    assert first["step"] == 1
    from training_checks import val_success_in_store

    assert first["val_success"] == val_success_in_store(tmp_path / "run" / "spans.duckdb", 1, len(val))
    assert main(["train", str(tmp_path / "train.yaml"), "--resume", "--max-steps", "2", "--json"]) == 0
    second = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert second["step"] == 2
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert list((run / "runs").glob("events.out.tfevents.*"))  # TensorBoard scalars were written
    config = json.loads((run / "config.json").read_text())
    assert config["credit"]["baseline"] == "rloo" and config["algorithm"]["name"] == "GRPO"
    assert config["credit"]["trajectory_aggregation"] is True


@pytest.mark.slow
def test_callable_agent_trains_in_process(tiny_model: Path, tmp_path: Path) -> None:
    import shutil

    from training_checks import assert_served_policy_changed, assert_trained, prime_half_right

    seen: list[LLMEndpoint] = []

    def agent(task: dict[str, Any], llm: LLMEndpoint) -> float:
        seen.append(llm)
        reply = llm.client().chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=8,
            temperature=llm.sampling["temperature"],
        )
        message = reply.choices[0].message
        text = message.content or ""
        if message.tool_calls:
            call = message.tool_calls[0].function
            text = f"<call> {call.name} {' '.join(str(v) for v in json.loads(call.arguments).values())} </call>"
        return calculator.reward(task, calculator.parse_call(text))  # returned: emitted as the reward

    tasks = calculator.make_tasks(6, seed=6)
    model = Path(shutil.copytree(tiny_model, tmp_path / "model"))
    # the right call or a wrong one (the swapped operator) with odds ~1/2 each: groups of 8 with unequal rewards
    prime_half_right(model,
                     [([{"role": "user", "content": t["question"]}], f"<call> {t['op']} {t['a']} {t['b']} </call>",
                       f"<call> {'sub' if t['op'] == 'add' else 'add'} {t['a']} {t['b']} </call>")
                      for t in tasks])
    trainer = Trainer(
        model=model, agent=agent, tasks=tasks, val_tasks=tasks[:2],
        algorithm=GRPO(learning_rate=5e-4), credit=LightningRL(),
        config=TrainerConfig(
            output_dir=str(tmp_path / "run"), n_rollouts=8, tasks_per_step=2, max_steps=1, eval_at_start=False,
            progress=False, torch_threads=1, runner=RunnerConfig(max_concurrency=4),
        ),
    )
    trainer.start()  # so train() leaves its server up: the served check below asks the reloaded server itself
    try:
        history = trainer.train()
        assert history[0]["rollouts_ok"] == 16 and history[0]["transitions"] == 16
        assert history[0]["policy_version"] == 1
        assert_trained(history[0], initial=model, checkpoint=tmp_path / "run" / "checkpoint-1")
        assert {llm.sampling["temperature"] for llm in seen} == {1.0, 0.0}  # training samples, evaluation greedy
        assert all("/rollouts/" in llm.base_url for llm in seen)
        assert_served_policy_changed(trainer.deploy(), [{"role": "user", "content": "3 add 4"}],
                                     initial=model, checkpoint=tmp_path / "run" / "checkpoint-1")
    finally:
        trainer.close()
