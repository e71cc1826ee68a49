"""The one training loop and its step: a source's rollouts in, one history row out, for both trainers.

Two sources feed the loop (`Source`): the Trainer's runner (``trainer.py``'s ``RunnerSource``: its rollouts run now,
or ahead while the last update computed, through ``rollouts/prefetch.py``) and the store (``online/trainer.py``'s
``OnlineTrainer``: the ready window of live traffic past its watermark, the ledger and watermark its exactly-once
commit point). Each turn of `TrainingStep.loop` takes a step's rollouts from the source and runs the step:

1. their transitions loaded once with the credit config (``load_training_batch``; per-agent policies each with
   their own credit; with the source's running baseline, credit sees them in the source's order);
2. the algorithm's checks: rollouts whose transitions fail them are quarantined (``bad_transitions``) and the rest
   loaded again (the baseline as it was, so that it observes only what is trained on);
3. the update(s) (``updates_per_step``, each on a seeded minibatch or on every row, at the source's one-off
   learning rate; under many processes rank 0 broadcasts the rows and every rank updates on its shard);
4. the one non-finite policy (``NonFiniteGuard``): a bad update is never pushed, the source undoes what it can
   (the store source restores its last committed checkpoint and quarantines the rollouts; the runner's GRPO and
   PPO skipped the optimizer step), and the ``max_bad_updates``-th in a row stops training after its row;
5. the source's commit (``Source.commit``; the store source saves a checkpoint and commits ledger and watermark),
   between the update and the weight push: the weights are pushed through the policy pool (in process) or from
   the committed checkpoint (a remote server's reload route);
6. the history row: the step's figures, then the source's (``Source.report``), to the reporting callbacks.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from spanrl.algorithms import distributed as _distributed
from spanrl.algorithms.baseline import RunningBaseline
from spanrl.algorithms.checks import bad_rollouts
from spanrl.algorithms.hf_trainer import one_off_learning_rate
from spanrl.errors import ServingError, TrainingError
from spanrl.rollouts.prefetch import policy_lag
from spanrl.trainer.config import TrainerConfig
from spanrl.trainer.reporting import NonFiniteGuard, StageClock

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.algorithms.base import Algorithm

__all__ = ["Servers", "Source", "Taken", "TrainingStep"]

_logger = logging.getLogger("spanrl.trainer.trainer")


@dataclasses.dataclass
class Taken:
    """A step's rollouts as a source hands them to the loop."""

    rollout_ids: list[str]  # to train on, in the order credit sees them
    policy_version: int | None  # the server's when they were taken
    sampler: random.Random | None = None  # picks the minibatches (the runner's, seeded per step)
    running: RunningBaseline | None = None  # credit's running baseline, updated (the store source's state)
    learning_rate: float | None = None  # a one-off learning rate for this step's update
    event: dict[str, Any] | None = None  # a row to report instead of a step (a guard's verdict)
    own: Any = None  # the source's own (the runner's StepRollouts; the store's ready window)


class Source(Protocol):
    """What feeds the loop: a step's rollouts, and the hooks of the step that are the source's own."""

    last_good: str
    """The sentence a stop after ``max_bad_updates`` ends with: where the last good weights are."""

    def take(self, step: int) -> Taken | None:
        """Step ``step``'s rollouts (``rollout_ids`` to train on, in order), an ``event`` row to report instead, or
        None: nothing ready (the loop waits)."""

    def commit(self, step: int, got: Taken, batch: Any, marks: dict[str, str]) -> Path | None:
        """After a good update (``batch``; None: nothing to train on), before the weight push; ``marks``: rollouts
        quarantined. Returns the committed checkpoint the weights are pushed from (None: push them from memory)."""

    def undo(self, step: int, got: Taken, batch: Any, marks: dict[str, str]) -> bool:
        """Undo a non-finite update (nothing is pushed); returns whether the step stands (its row is recorded)."""

    def report(self, step: int, got: Taken, batch: Any, row: dict[str, Any]) -> dict[str, Any] | None:
        """The step's history row with the source's own figures (None: no step, e.g. nothing was trained)."""


class Servers(Protocol):
    """The servers the step updates, each hook called by name: the Trainer's `PolicyPool` (rollouts/policy_pool.py,
    in process and ``serving.urls``), or online the one remote server, reloaded from the committed checkpoint
    (online/trainer.py's ``RemoteServer``)."""

    @property
    def version(self) -> int:
        """The policy version they serve now (the update's rows are its lag's reference)."""

    def sleep(self) -> bool:
        """Before an update: free the GPU memory they hold until the reload wakes them (``serving.enable_sleep_mode``:
        vLLM's sleep mode); False: nothing was done."""

    def reload(self, weights: Any) -> int:
        """Serve ``weights`` (a module or a state_dict; a checkpoint folder once committed); the new version."""

    def reload_lora(self, model: Any, merged: Callable[[], Any]) -> int:
        """Serve a LoRA policy (``algorithm.lora``: ``model`` a PEFT model, ``merged()`` its plain-keyed weights
        with the adapter merged in); the new version."""


class TrainingStep:
    """Transitions, checks, update(s), non-finite policy, commit and weight push (see the module docstring)."""

    def __init__(self, *, algorithm: Algorithm, credit: Any, config: TrainerConfig | None, store: Any, server: Servers,
                 max_bad_updates: int, bad_updates: int = 0, check_weights: bool = False, world: int = 1) -> None:
        """``config``: the Trainer's (None online: every agent, one update on every row per step);
        ``bad_updates``: non-finite updates in a row so far (the online trainer's committed count);
        ``check_weights``: judge the weights after each update too (online: a remote server checks a reload only
        after the commit; the Trainer's pool checks each in-process push itself, ``serving``'s weight checks)."""
        self.algorithm, self.credit, self.config = algorithm, credit, config
        self.store, self.server, self.world, self.check_weights = store, server, world, check_weights
        self.nonfinite = NonFiniteGuard(max_bad_updates, bad=bad_updates)
        self._problem: str | None = None  # the last update's, when it was not finite

    # --- the loop ----------------------------------------------------------------------------------
    def loop(self, source: Source, *, step: int, done: Callable[[int], bool], record: Callable[[dict], None],
             idle: Callable[[], None] = lambda: None, retry: tuple[type[Exception], ...] = ()) -> None:
        """Turn until ``done(step)``; ``idle()`` when nothing was ready, or an error of ``retry`` came (logged)."""
        while not done(step):
            try:
                row = self.turn(source, step + 1, record)
            except retry as exc:  # a server or collector out of reach: wait, try again
                _logger.warning("spanrl: %s; trying again", exc)
                row = None
            if row is None:
                idle()
            else:
                step = row["step"]

    def turn(self, source: Source, step: int, record: Callable[[dict], None]) -> dict[str, Any] | None:
        """One turn: step ``step`` on the source's rollouts (or its event row), the row recorded; then a stop after
        ``max_bad_updates`` non-finite updates in a row. Returns the row (None: nothing happened)."""
        clock = StageClock("decompose", "update", "reload")  # time/step_s counts the wait for the rollouts
        self._problem = None
        got = source.take(step)
        row = None if got is None else got.event if got.event is not None else self.run(step, got, source, clock)
        if row is not None:
            record(row)
        if self._problem is not None:
            self.nonfinite.stop_if_too_many(self._problem, last_good=source.last_good)
        return row

    # --- the step ----------------------------------------------------------------------------------
    def run(self, step: int, got: Taken, source: Source, clock: StageClock) -> dict[str, Any] | None:
        """Step ``step`` on the rollouts ``got``; returns the step's history row (not recorded), or None."""
        row: dict[str, Any] = {"step": step, "policy_version": got.policy_version}
        with clock("decompose"):
            batch, marks = self.load_checked(got.rollout_ids, running=got.running)
        if batch is not None:
            rewards = [float(v) for v in batch.rewards_by_rollout.values() if v is not None]
            row.update(reward_mean=sum(rewards) / len(rewards) if rewards else None, transitions=len(batch),
                       transitions_report=dict(batch.report))
            row.update(getattr(batch, "metrics", {}))  # the learned critic's figures (algorithms/value_head.py)
        if batch is None or not len(batch):
            source.commit(step, got, None, marks)
            return source.report(step, got, None, {**row, **clock.row()})
        # columnar all the way: no dataclass per row on the training path
        row["advantage_mean"] = float(np.mean(batch.to_arrow().column("advantage").to_numpy()))
        row.update(policy_lag(batch, self.policy_version()))
        with clock("update"):
            metrics = self._updates(batch, got)
        row.update({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        self._problem = self.nonfinite.judge(metrics, self.algorithm if self.check_weights else None)
        if self._problem is not None:  # never pushed; the source undoes what it can
            _logger.warning("step %d: update %d of %d in a row not finite (%s); not pushed", step,
                            self.nonfinite.bad, self.nonfinite.max_bad, self._problem)
            return source.report(step, got, batch, {**row, **clock.row()}) \
                if source.undo(step, got, batch, marks) else None
        committed = source.commit(step, got, batch, marks)
        with clock("reload"):
            row.update(self._push(step, committed))
        return source.report(step, got, batch, {**row, **clock.row()})

    def load(self, rollout_ids: Sequence[str], *, running: RunningBaseline | None = None) -> Any:
        """The rollouts' transitions, credit assigned once (``load_training_batch``); with ``running`` (baseline
        ``running``'s state, updated) credit sees the rollouts in the order of ``rollout_ids``."""
        agents = [self.config.agent_name] if self.config and self.config.agent_name else None
        return self.algorithm.load_batch(self.store, self.credit, list(rollout_ids), agents=agents, running=running)

    def load_checked(self, rollout_ids: Sequence[str], *, running: RunningBaseline | None) -> tuple[Any, dict]:
        """``load``, then the algorithm's checks (``bad_rollouts``): the rollouts that fail them are marked and the
        rest loaded again from ``running`` as it was (a forged rollout is rare). (batch or None, marks)."""
        if not rollout_ids:
            return None, {}
        before = copy.deepcopy(running)
        batch = self.load(rollout_ids, running=running)
        marks = bad_rollouts(self.algorithm, batch) if len(batch) else {}
        if not marks:
            return batch, marks
        if running is not None:  # in place: the source holds this object
            vars(running).update(vars(before))
        kept = [i for i in rollout_ids if i not in marks]
        return (self.load(kept, running=running) if kept else None), marks

    def _updates(self, batch: Any, got: Taken) -> dict[str, float]:
        cfg, n, metrics = self.config, len(batch), {}
        for _ in range(cfg.updates_per_step if cfg else 1):
            if cfg and cfg.minibatch_size and cfg.minibatch_size < n:
                # the same rows from the same RNG as sampling the list of transitions would pick
                assert got.sampler is not None  # the runner's: minibatches are the Trainer's
                metrics = self.update(batch.take(got.sampler.sample(range(n), cfg.minibatch_size)),
                                      got.learning_rate)
            else:
                metrics = self.update(batch, got.learning_rate)
        return metrics

    def update(self, transitions: Any, learning_rate: float | None = None) -> dict[str, float]:
        """One algorithm update (at ``learning_rate`` for this one, when given); under many processes rank 0
        broadcasts the transitions and every rank updates on its shard (the metrics are rank 0's shard's)."""
        self.server.sleep()
        if self.world == 1:
            with one_off_learning_rate(self.algorithm, learning_rate), _torch_threads(self.config):
                return self.algorithm.update(transitions)
        from spanrl.algorithms.tables import transitions_of

        items = _distributed.broadcast(transitions_of(transitions))
        return self.algorithm.update(_distributed.shard_transitions(items))

    def _push(self, step: int, committed: Path | None) -> dict[str, Any]:
        """Reload the servers: from the committed checkpoint (a remote server), else through the pool as the
        algorithm serves itself (``Algorithm.push_weights``). Returns the history row's policy version(s)."""
        if committed is not None:
            try:
                return {"policy_version": self.server.reload(committed)}
            except ServingError as exc:  # committed: a rerun resumes here, and its start() loads it into the server
                raise TrainingError(f"update {step} is saved ({committed.name}) but the server did not load it: "
                                    f"{exc}. Run again once it can: the rerun resumes here and loads it") from None
        return self.algorithm.push_weights(self.server, in_place=self.world == 1)  # many processes: merged weights

    def policy_version(self) -> int:
        """The version the update starts from: the pool's (in process), or asked of a remote server."""
        return self.server.version


@contextlib.contextmanager
def _torch_threads(config: TrainerConfig | None) -> Iterator[None]:
    """``config.update_threads`` torch threads for the block, then the process's own number again."""
    threads = config.update_threads if config is not None else None
    if threads is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
