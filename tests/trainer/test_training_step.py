"""The one loop of both trainers (trainer/training_step.py) against an in-memory source, algorithm and server: the
order of a step (update, the source's commit, the push), the algorithm's checks, the non-finite policy, a source
with nothing ready or an event row; the hooks the step calls on the Trainer's real pool of servers. The two real
sources run in tests/trainer/test_trainer.py and tests/online/test_online*.py."""

from __future__ import annotations

import math
from types import SimpleNamespace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spanrl.algorithms.tables import TRANSITIONS_SCHEMA
from spanrl.algorithms.transitions import TransitionBatch
from spanrl.errors import TrainingError
from spanrl.trainer.training_step import Taken, TrainingStep


def _row(rollout_id: str, prompt: list[int]) -> dict[str, Any]:
    return dict(rollout_id=rollout_id, task_id="t", attempt=1, agent=None, step=0, prompt_ids=prompt,
                completion_ids=[8], completion_mask=[1], old_logprobs=[-0.5], reward=1.0, advantage=0.5,
                policy_version=0, retokenized=False, temperature=None)


class _Algorithm:
    """Loads each rollout as one transition (``forged`` with a token id outside its 50-word vocabulary)."""

    def __init__(self, events: list[Any], loss: float) -> None:
        self.events, self.loss = events, loss
        self.model = SimpleNamespace(config=SimpleNamespace(vocab_size=50))

    def load_batch(self, store: Any, credit: Any, rollout_ids: list[str], **_: Any) -> TransitionBatch:
        self.events.append(("load", rollout_ids))
        rows = [_row(i, [99] if i == "forged" else [5]) for i in rollout_ids]
        table = pa.Table.from_pylist(rows, schema=TRANSITIONS_SCHEMA)
        return TransitionBatch(table, {}, dict.fromkeys(rollout_ids, 1.0))

    def update(self, batch: Any) -> dict[str, float]:
        self.events.append(("update", len(batch)))
        return {"losses/policy_loss": self.loss, "charts/grad_norm": 1.0}

    def push_weights(self, server: Any, *, in_place: bool = True) -> dict[str, Any]:
        return {"policy_version": server.reload(self.model)}


class _Server:
    def __init__(self, events: list[Any]) -> None:
        self.events, self.version = events, 0

    def sleep(self) -> bool:
        self.events.append(("sleep",))
        return False

    def reload(self, weights: Any) -> int:
        self.version += 1
        self.events.append(("push", self.version))
        return self.version


class _Source:
    """Hands out ``takes`` in turn (None: nothing ready), then step rollouts ``good`` and ``forged``."""

    last_good = "The last good weights are served"

    def __init__(self, events: list[Any], takes: list[Taken | None], *, stands: bool = True) -> None:
        self.events, self.takes, self.stands = events, takes, stands

    def take(self, step: int) -> Taken | None:
        return self.takes.pop(0) if self.takes else Taken(["good", "forged"], 0)

    def commit(self, step: int, got: Taken, batch: Any, marks: dict[str, str]) -> None:
        self.events.append(("commit", step, None if batch is None else len(batch), marks))

    def undo(self, step: int, got: Taken, batch: Any, marks: dict[str, str]) -> bool:
        self.events.append(("undo", step))
        return self.stands

    def report(self, step: int, got: Taken, batch: Any, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "source": "fake"}


def _step(events: list[Any], loss: float, max_bad_updates: int = 3) -> TrainingStep:
    return TrainingStep(algorithm=_Algorithm(events, loss), credit=None, config=None, store=None,
                        server=_Server(events), max_bad_updates=max_bad_updates)


def test_a_step_updates_then_commits_then_pushes_and_quarantines_what_fails_the_checks() -> None:
    events: list[Any] = []
    waits, rows = [], []
    verdict = {"step": 0, "event": "accepted"}
    source = _Source(events, [None, Taken([], 0, event=verdict)])
    _step(events, loss=0.25).loop(source, step=0, done=lambda step: step >= 1, record=rows.append,
                                  idle=lambda: waits.append(1))
    assert waits == [1] and rows[0] is verdict  # nothing ready: the loop waited; an event row is recorded as is
    assert events == [("load", ["good", "forged"]), ("load", ["good"]), ("sleep",), ("update", 1),
                      ("commit", 1, 1, {"forged": "bad_transitions"}), ("push", 1)]
    step = rows[1]
    assert (step["step"], step["transitions"], step["policy_version"], step["source"]) == (1, 1, 1, "fake")
    assert step["losses/policy_loss"] == 0.25 and step["time/step_s"] >= step["time/update_s"] > 0


@pytest.mark.parametrize("stands", [True, False], ids=["trainer", "online"])
def test_a_non_finite_update_is_never_pushed_and_the_last_allowed_stops_the_loop_after_its_row(stands: bool) -> None:
    events: list[Any] = []
    rows: list[dict[str, Any]] = []
    with pytest.raises(TrainingError, match=r"^2 updates in a row were not finite \(max_bad_updates 2; last: "
                                            r"losses/policy_loss = nan\); stopped. The last good weights are served"):
        _step(events, loss=math.nan, max_bad_updates=2).loop(_Source(events, [], stands=stands), step=0,
                                                             done=lambda step: False, record=rows.append)
    assert [e for e in events if e[0] in ("commit", "push", "undo")] == [("undo", 1), ("undo", 1 if not stands else 2)]
    # the Trainer's step stands (its row recorded, the last one's too); online, an undone update is no step
    assert [row["step"] for row in rows] == ([1, 2] if stands else [])


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_the_step_sleeps_the_pool_before_the_update_and_pushes_a_lora_policy_through_reload_lora(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spanrl.algorithms import GRPO
    from spanrl.algorithms.lora import LoRAConfig
    from spanrl.demo.calculator.tasks import make_tasks
    from spanrl.rollouts.policy_pool import PolicyPool
    from spanrl.trainer import Trainer, TrainerConfig

    calls: list[str] = []

    class RecordingPool(PolicyPool):  # the real pool, the Trainer's server and its embedded one; its calls recorded
        def sleep(self) -> bool:
            calls.append("sleep")
            return super().sleep()

        def reload_lora(self, model: Any, merged: Any) -> int:
            calls.append("reload_lora")
            return super().reload_lora(model, merged)

        def reload(self, weights: Any, adapter: str | None = None) -> int:
            calls.append("reload")
            return super().reload(weights, adapter)

    def agent(task: dict[str, Any], llm: Any) -> float:
        reply = llm.client().chat.completions.create(model=llm.model, max_tokens=6, temperature=1.0,
                                                     messages=[{"role": "user", "content": task["question"]}])
        return len(reply.choices[0].message.content or "") / 10  # varies between samples: a gradient to follow

    monkeypatch.setattr("spanrl.trainer.services.PolicyPool", RecordingPool)
    config = TrainerConfig(output_dir=str(tmp_path / "run"), n_rollouts=3, tasks_per_step=2, max_steps=1,
                           eval_at_start=False, progress=False, torch_threads=1)
    trainer = Trainer(model=tiny_model, agent=agent, tasks=make_tasks(4, seed=1), config=config,
                      algorithm=GRPO(learning_rate=5e-2, lora=LoRAConfig(r=4, alpha=8)))
    history = trainer.train()
    # no other server: reload_lora hands the embedded server the merged weights
    assert calls == ["sleep", "reload_lora", "reload"]
    assert history[-1]["policy_version"] == 1 and history[-1]["transitions"] == 6


@pytest.mark.usefixtures("one_torch_thread")
def test_the_update_runs_on_update_threads_and_the_rest_of_the_step_on_torch_threads(
        tiny_model: Path, tmp_path: Path) -> None:
    import torch

    from spanrl.algorithms import GRPO
    from spanrl.demo.calculator.tasks import make_tasks
    from spanrl.errors import ConfigError
    from spanrl.trainer import Trainer, TrainerConfig

    seen: list[int] = []

    class CountingGRPO(GRPO):  # the real update; the threads it ran on recorded
        def update(self, batch: Any) -> dict[str, float]:
            seen.append(torch.get_num_threads())
            return super().update(batch)

    def agent(task: dict[str, Any], llm: Any) -> float:
        reply = llm.client().chat.completions.create(model=llm.model, max_tokens=6, temperature=1.0,
                                                     messages=[{"role": "user", "content": task["question"]}])
        return len(reply.choices[0].message.content or "") / 10

    config = TrainerConfig(output_dir=str(tmp_path / "run"), n_rollouts=2, tasks_per_step=2, max_steps=2,
                           eval_at_start=False, progress=False, torch_threads=1, update_threads=2)
    trainer = Trainer(model=tiny_model, agent=agent, tasks=make_tasks(4, seed=1), config=config,
                      algorithm=CountingGRPO(learning_rate=5e-2))
    assert [row["step"] for row in trainer.train()] == [1, 2]
    assert seen == [2, 2] and torch.get_num_threads() == 1  # back to torch_threads after each update
    with pytest.raises(ConfigError, match=r"^update_threads: with async_steps the next step's rollouts run beside"):
        TrainerConfig(update_threads=2, async_steps=True).validate()
