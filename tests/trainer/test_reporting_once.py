"""One reporting path: the algorithm returns its metrics, the Trainer's callbacks write them, each key
once per step; the console is one of those callbacks. End to end on a tiny model (real collector, policy
server, DuckDB, GRPO / PPO updates) with TensorBoard on, reading back the event files it wrote."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from spanrl.algorithms import GRPO, PPO
from spanrl.trainer import LLMEndpoint, RunnerConfig, Trainer, TrainerConfig
from spanrl.trainer.console import Console, step_line
from spanrl.trainer.reporting import Callback, scalars_of

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "calculator"))

import calculator  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _agent(task: dict[str, Any], llm: LLMEndpoint) -> float:
    reply = llm.client().chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=6,
        temperature=llm.sampling["temperature"],
    )
    return len(reply.choices[0].message.content or "") / 10  # varies between samples: a gradient to follow


def _scalar_writes(runs: Path) -> collections.Counter[tuple[str, int]]:
    """How many times each (tag, step) was written to the TensorBoard event files under ``runs``."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    writes: collections.Counter[tuple[str, int]] = collections.Counter()
    for path in runs.rglob("events.out.tfevents.*"):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != "text":  # the config, written once at the start
                    writes[value.tag, event.step] += 1
    return writes


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [GRPO(learning_rate=1e-2), PPO(learning_rate=1e-2)], ids=["grpo", "ppo"])
def test_each_key_is_written_once_per_step(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                           algorithm: Any) -> None:
    tasks = calculator.make_tasks(4, seed=5)
    config = TrainerConfig(
        output_dir=str(tmp_path / "run"), n_rollouts=2, tasks_per_step=2, max_steps=2, eval_every=1,
        eval_at_start=True, progress=True, torch_threads=1, report_to=("tensorboard",),
        runner=RunnerConfig(max_concurrency=2),
    )
    trainer = Trainer(model=tiny_model, agent=_agent, tasks=tasks, val_tasks=tasks[:1], algorithm=algorithm,
                      config=config)
    with trainer:
        consoles = [c for c in trainer._callbacks if isinstance(c, Console)]
        assert len(consoles) == 1  # the console is one of the callbacks, not a path of its own
        history = trainer.train()
    assert [row["step"] for row in history] == [0, 1, 2]
    assert all("losses/policy_loss" in row for row in history[1:])

    # TensorBoard holds exactly the rows' scalars: each (tag, step) once, nothing the algorithm wrote itself
    writes = _scalar_writes(tmp_path / "run" / "runs")
    twice = {key: n for key, n in writes.items() if n > 1}
    assert not twice, f"written more than once in a step: {twice}"
    expected = {(tag, row["step"]) for row in history for tag in scalars_of(row)}
    assert set(writes) == expected
    # the Trainer's reward_mean (rollouts) and the algorithm's charts/reward_mean (transitions) are two tags
    assert {("trainer/reward_mean", 1), ("charts/reward_mean", 1), ("losses/policy_loss", 2)} <= set(writes)

    # history.jsonl: one line per recorded row, as recorded
    lines = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert lines[-1]["losses/policy_loss"] == pytest.approx(history[-1]["losses/policy_loss"])

    # the console printed each row's line once (output captured: no progress bar, the lines only)
    out = capsys.readouterr().out.splitlines()
    for row in history:
        assert out.count(step_line(row, 2)) == 1


def test_the_console_is_an_ordinary_callback(capsys: pytest.CaptureFixture) -> None:
    console = Console(max_steps=30)
    assert isinstance(console, Callback)
    row = {"step": 3, "reward_mean": 0.62, "losses/approx_kl": 0.0012, "rollouts_ok": 8, "time/step_s": 1.5}
    console.on_row(row)  # outside any loop: the line alone
    with console.running(done=3):  # output captured: still the line alone, no bar
        assert console.rollout_bar("train", 4)[0]() is None
        console.on_row({**row, "step": 4})
    console.on_end([row])
    console.close()
    console.close()  # safe twice
    assert capsys.readouterr().out.splitlines() == [step_line(row, 30), step_line({**row, "step": 4}, 30)]


def test_scalar_tags_keep_the_trainer_and_algorithm_keys_apart() -> None:
    row = {"step": 1, "reward_mean": 0.5, "charts/reward_mean": 0.25, "transitions": 6, "charts/transitions": 6.0,
           "losses/policy_loss": 0.1, "time/step_s": 2.0, "ok": True, "transitions_report": {"transitions": 6}}
    assert scalars_of(row) == {
        "trainer/reward_mean": 0.5, "charts/reward_mean": 0.25, "trainer/transitions": 6.0,
        "charts/transitions": 6.0, "losses/policy_loss": 0.1, "time/step_s": 2.0,
    }
