"""Online training on live traffic: follow the span store, train on rollouts as their feedback arrives.

Nothing here starts agents or servers. Agents run in production against a ``spanrl serve`` someone
else started; their spans and (late) feedback reach a ``spanrl collector``. The ``OnlineTrainer`` is a
source (``training_step.Source``) of the Trainer's loop, ``TrainingStep.loop``; each turn:

1. ``take``: poll the store (through the collector's SQL endpoint) for rollouts that became *ready*
   (complete and rewarded; ``spanrl.store.online``) after its watermark and ``settle_s`` ago, and skip those
   whose policy is more than ``max_policy_lag`` versions behind the server's (counted);
2. the rest through the Trainer's step: transitions loaded once (recorded token ids and log-probs; calls
   sampled at another temperature than the algorithm's skipped), every call scored with the rollout's latest
   usable reward (credit's ``nan_reward="ignore"``, the ready query's rule), advantages by credit assignment's
   ``running`` baseline (a per-task running mean of earlier rewards, ``spanrl.algorithms.baseline``, its state
   in ``online/state.py``), which sees them in ready order; the algorithm's checks (a forged rollout quarantined);
3. one GRPO update (at ``learning_rate_overrides``' rate for its step): the ratio is taken against the
   *recorded* sampling log-probs and clipped, which corrects for the policy lag of the rollouts that were kept;
   a non-finite one is undone (``undo``: the last committed checkpoint restored, its rollouts quarantined);
4. ``commit``: checkpoint (``algorithms/checkpoint_folders.py``'s names and pruning), ledger, then
   ``online_state.json`` (the commit point); then the step reloads the server from that checkpoint through its
   ``POST /v1/weights/reload`` route (``spanrl.serving.client``): serving never stops, and every later response
   carries the new policy version; ``report``: the Trainer's history row with the online figures, to the
   reporting callbacks (``history.jsonl``, and any given).
5. with ``guard`` on, each reload opens a trial: no update until the new version's live reward is judged
   against the previous weights' (its verdict a row of its own), and a version that made it worse is rolled
   back (``online/guard.py``).

Its lifecycle is the Trainer's (``trainer/lifecycle.py``): NEW, then RUNNING after ``start()``, TRAINING
inside ``run()``, CLOSED after ``close()``; a call that does not fit (``poll_once()`` before ``start()``,
``run()`` inside ``run()``) raises `TrainingError` naming the state.

Feedback that first arrives more than ``max_age_s`` after its rollout completed is never trained on;
such rollouts are counted as ``aged_out``. After a crash the trainer resumes from the committed state
and never trains a rollout twice (``ledger.jsonl`` holds each handled rollout once).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spanrl import env
from spanrl import semconv as sc
from spanrl.algorithms.credit_config import CreditConfig
from spanrl.algorithms.presets import check_credit
from spanrl.errors import USAGE_EXIT_CODE, ConfigError, ServingError, StoreUnavailableError, TrainingError
from spanrl.serving.client import PolicyClient
from spanrl.store.online import ReadyRollout, Watermark, count_aged_out, now_ns, ready_window
from spanrl.algorithms import checkpoint_folders as checkpoints
from spanrl.trainer.config import CONFIG_FILE, HISTORY_FILE
from spanrl.trainer.lifecycle import Lifecycle, State
from spanrl.online.config import OnlineConfig
from spanrl.online.guard import Guard
from spanrl.online.state import Ledger, OnlineState
from spanrl.trainer.reporting import Callback, HistoryFile
from spanrl.trainer.training_step import Taken, TrainingStep
from spanrl.trust import env_token, read_token_file

__all__ = ["OnlineTrainer"]

_logger = logging.getLogger("spanrl.online")
_NS_PER_S = 1_000_000_000
_SERVER_WAIT_S = 120.0  # how long start() waits for a policy server that does not answer yet (loading its model)


@dataclasses.dataclass(frozen=True)
class _Window:
    """What a step's rollouts came from (``Taken.own``): the ready window in watermark order, the server's policy
    version when it was read, and the checkpoint a rejection of the update restores (None: the guard is off)."""

    ready: list[ReadyRollout]
    version: int
    previous: str | None


def _good_reward(reward: float | None) -> bool:
    """A reward the trainer can use: finite and within ``semconv.REWARD_ABS_MAX`` (the store checks it too)."""
    return reward is not None and math.isfinite(reward) and abs(reward) <= sc.REWARD_ABS_MAX


class RemoteServer:
    """The step's `Servers` here: the one policy server this trainer follows, someone else's process, reloaded over
    HTTP from the committed checkpoint only (``commit`` always returns one): no GPU of ours to free before an update,
    and a LoRA policy reaches it as that checkpoint too."""

    def __init__(self, client: PolicyClient) -> None:
        self.client = client

    @property
    def version(self) -> int:
        return self.client.version()

    def sleep(self) -> bool:
        return False

    def reload(self, weights: Any) -> int:
        return self.client.reload(weights)

    def reload_lora(self, model: Any, merged: Any) -> int:
        raise TrainingError("online training reloads its server from the committed checkpoint only")


class OnlineTrainer(Lifecycle):
    """Follows the store and trains the served policy (see the module docstring).

    ``algorithm``: a weight-training `Algorithm` (default ``GRPO()``); ``store``: anything with
    ``sql(query, params)`` (default: ``RemoteStore(config.store_url)``); ``callbacks``: reporting
    callbacks (``trainer/reporting.py``: a console line, metrics) each history row goes to after
    ``history.jsonl``. ``run()`` until ``max_updates`` / ``max_seconds`` / ``stop()``, then ``close()``.
    """

    _WORDS = {"loop": "run()", "ready": "loaded", "ready_again": "load the committed state"}
    _STATE_FIELD = "lifecycle"

    def __init__(self, config: OnlineConfig, *, algorithm: Any = None, store: Any = None,
                 callbacks: Sequence[Callback] = ()) -> None:
        self.config = config.validate()
        if algorithm is None:
            from spanrl.algorithms import GRPO

            algorithm = GRPO()
        self.algorithm = algorithm
        read = {f: read_token_file(getattr(config, f), field=f) for f in ("collector_token_file", "admin_token_file")
                if getattr(config, f) is not None}
        if store is None:
            from spanrl.store import RemoteStore
            token = config.collector_token or read.get("collector_token_file")  # then the read scope's variable
            token = token or env_token(env.SPANRL_COLLECTOR_READ_TOKEN) or env_token(env.SPANRL_COLLECTOR_TOKEN)
            store = RemoteStore(config.store_url, token=token)
        self.store = store
        self.server = PolicyClient(config.server_url, token=read.get("admin_token_file"))
        self.output_dir = Path(config.output_dir)
        self._extra_callbacks = list(callbacks)
        self._callbacks: list[Callback] = []
        self._stop = threading.Event()
        self.lifecycle = State.NEW
        self.state: OnlineState | None = None
        """The committed state (None before ``start()``); it stays readable after ``close()``."""
        self.ledger: Ledger | None = None
        self.guard = Guard(config, self, store=store, server=self.server, output_dir=self.output_dir)
        credit = CreditConfig(mode="identical", baseline="running", scale_std=config.scale_std, missing_reward="skip",
                              nan_reward="ignore", reward_name=config.reward_name)  # store/online.py's reward
        check_credit(getattr(algorithm, "config", None), credit, field="scale_std")  # Dr. GRPO: no std division
        self.training = TrainingStep(algorithm=algorithm, credit=credit, config=None, store=store,
                                     server=RemoteServer(self.server), max_bad_updates=config.max_bad_updates,
                                     check_weights=True)
        """The loop and its step (``trainer/training_step.py``), this trainer their source."""

    # --- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> "OnlineTrainer":
        """Load the committed state and checkpoint (or the starting model) and sync the server to it."""
        self._refuse("start()", State.TRAINING)
        if self.lifecycle is State.RUNNING:
            return self
        import torch

        cfg = self.config
        if cfg.torch_threads is not None:
            torch.set_num_threads(cfg.torch_threads)
        if not Path(cfg.model).is_dir():
            raise ConfigError(f"model must be an HF model folder, got {cfg.model!r} (no such folder)")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._wait_for_server()  # a server started beside the trainer may still be loading its model
        try:  # now, not after an update nobody would be served
            self.server.check_reload(self.output_dir)
        except ServingError as exc:  # the server's flags, the token or output_dir: a setup to fix, bad input
            exc.exit_code = USAGE_EXIT_CODE
            raise
        self.state = OnlineState.load(self.output_dir, window=cfg.baseline_window, prior=cfg.baseline_prior,
                                      clip_std=cfg.baseline_clip_std)
        self.ledger = Ledger(self.output_dir, self.state.ledger_lines)
        self.training.nonfinite.bad = self.state.bad_updates  # non-finite updates in a row, committed
        self.algorithm.setup(model_path=Path(cfg.model), output_dir=self.output_dir / "algorithm", seed=cfg.seed)
        if self.state.checkpoint is not None:
            checkpoint = self.output_dir / self.state.checkpoint
            self.load_weights(self.state.checkpoint)
            try:  # the server may hold the weights of an update that was never committed
                version = self.server.reload(checkpoint)
                self.guard.serving(version)
                _logger.info("resumed at step %d from %s; policy version %d", self.state.step, checkpoint, version)
            except ServingError as exc:
                _logger.warning("spanrl online: could not sync the server to %s (%s); the next update will",
                                checkpoint, exc)
        saved = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "collector_token"}  # never a secret on disk
        (self.output_dir / CONFIG_FILE).write_text(json.dumps(saved, indent=1))
        self._callbacks = [HistoryFile(self.output_dir / HISTORY_FILE), *self._extra_callbacks]
        self.lifecycle = State.RUNNING
        return self

    def _wait_for_server(self) -> None:
        """Return once the policy server answers; `ServingError` when it has not within ``_SERVER_WAIT_S``
        (a server that answers and refuses reloads fails at once, in ``check_reload``)."""
        deadline = time.monotonic() + _SERVER_WAIT_S
        while True:
            try:
                self.server.health()
                return
            except ServingError as exc:
                if time.monotonic() > deadline:
                    raise ServingError(f"{exc} (waited {_SERVER_WAIT_S:.0f} s; start `spanrl serve` first)") from None
                _logger.info("spanrl online: %s; waiting for it", exc)
                time.sleep(self.config.poll_interval_s)

    def stop(self) -> None:
        """Ask ``run()`` to return after the current poll or update (safe from a signal handler)."""
        self._stop.set()

    def close(self) -> None:
        """Close the reporting callbacks; the committed state stays on disk (and in ``state``). Safe twice."""
        self._refuse("close()", State.TRAINING)
        self._close_callbacks()
        if self.lifecycle is not State.NEW:
            self.lifecycle = State.CLOSED

    def _loaded(self, action: str) -> tuple[OnlineState, Ledger]:
        """The committed state and ledger, or `TrainingError` naming the state when nothing is loaded."""
        self._refuse(action, State.NEW, State.CLOSED)
        return self.committed(action)

    # --- what the guard gates (guard.Gated) ------------------------------------------------------
    def committed(self, action: str = "read the online state") -> tuple[OnlineState, Ledger]:
        """The committed state and ledger (loaded by ``start()``); `TrainingError` before."""
        if self.state is None or self.ledger is None:  # RUNNING / TRAINING always have both
            raise TrainingError(f"cannot {action}: the online state is not loaded")
        return self.state, self.ledger

    def load_weights(self, checkpoint: str) -> None:
        """Restore the algorithm's weights, optimizer, scheduler and RNG from ``checkpoint`` (its name)."""
        self.algorithm.load_state(self.output_dir / checkpoint)

    def run(self) -> list[dict[str, Any]]:
        """Poll and update until a stop condition (the Trainer's loop, ``TrainingStep.loop``, fed by this
        source); returns this run's history rows."""
        self._refuse("run()", State.TRAINING)
        self.start()
        state, _ = self._loaded("run()")
        cfg, history = self.config, []
        deadline = None if cfg.max_seconds is None else time.monotonic() + cfg.max_seconds

        def done(step: int) -> bool:
            return self._stop.is_set() or (cfg.max_updates is not None and step >= cfg.max_updates) or \
                (deadline is not None and time.monotonic() >= deadline)

        self.lifecycle = State.TRAINING
        try:
            self.training.loop(self, step=state.step, done=done, record=lambda row: history.append(self._report(row)),
                               idle=lambda: self._stop.wait(cfg.poll_interval_s),
                               retry=(ServingError, StoreUnavailableError))
        finally:
            self.lifecycle = State.RUNNING
        return history

    def poll_once(self) -> dict[str, Any] | None:
        """One turn of the loop: an update (its history row, reported) when enough fresh rollouts are ready, a
        guard's verdict row, or None."""
        state, _ = self._loaded("poll_once()")
        return self.training.turn(self, state.step + 1, self._report)

    def _report(self, row: dict[str, Any]) -> dict[str, Any]:
        for callback in self._callbacks:
            callback.on_row(row)
        return row

    # --- the loop's source (training_step.Source) ------------------------------------------------------
    def take(self, step: int) -> Taken | None:
        """One look at the store: the fresh rollouts of a step when enough are ready (in ready order, with the
        running baseline and the step's one-off learning rate), the open trial's verdict, or None."""
        state, ledger = self._loaded("poll_once()")
        cfg = self.config
        now = now_ns(self.store)
        horizon = max(0, min(state.watermark.ready_ns, state.aged_until_ns or now) - 2 * int(cfg.max_age_s * _NS_PER_S))
        window = dict(now=now, horizon_ns=horizon, quiet_s=cfg.quiet_s, max_age_s=cfg.max_age_s,
                      reward_name=cfg.reward_name)
        aged, failed = count_aged_out(self.store, since_ns=state.aged_until_ns, **window)
        state.count("aged_out", aged)
        state.count("failed", failed)
        state.aged_until_ns = now
        version = self.server.version()
        if state.trial is not None and not cfg.guard:  # the guard was turned off: no trial to decide
            state.trial = None
        if state.trial is not None:  # no update until the newest one is judged (online/guard.py)
            verdict = self.guard.judge()
            if verdict is not None:
                return Taken([], version, event=verdict)
        ready, usable = ready_window(self.store, state.watermark, settle_s=cfg.settle_s, most=cfg.max_rollouts,
                                     usable=lambda r: r.rollout_id not in ledger.seen and self._usable(r, version),
                                     **window)
        usable_ids = {r.rollout_id for r in usable}
        fresh = [r.rollout_id for r in ready if r.rollout_id in usable_ids]
        if len(fresh) >= cfg.min_rollouts and state.trial is None:
            # with the guard on, the weights a rejection of this update restores (saved before it changes them)
            previous = self.guard.base()
            return Taken(fresh, version, running=state.baseline, own=_Window(ready, version, previous),
                         learning_rate=cfg.learning_rate_overrides.get(step))
        # Not enough to train: still move past a leading run of rollouts that will never train.
        prefix = list(itertools.takewhile(lambda r: r.rollout_id not in usable_ids, ready))
        if prefix or aged or failed:
            self._commit(prefix, trained={}, checkpoint=None, version=version)
        return None

    def commit(self, step: int, got: Taken, batch: Any, marks: dict[str, str]) -> Path | None:
        """The exactly-once commit point, between the update and the reload: ``checkpoint-<step>``, the ledger
        lines of the window's rollouts, then the state (watermark, checkpoint). Nothing trained: the ledger and
        watermark move past the window."""
        state, window = self.state, got.own
        assert state is not None
        state.bad_updates = self.training.nonfinite.bad
        if batch is None:
            self._commit(window.ready, trained={}, checkpoint=None, version=window.version, marks=marks)
            return None
        trained = self._trained(batch, window.ready)
        state.step = step
        checkpoint = self.save_checkpoint(step)
        if window.previous is not None:  # on trial from now on; a crash before the reload resumes it (start())
            state.trial = self.guard.open(step=step, checkpoint=checkpoint, previous=window.previous,
                                         version=window.version,
                                         oldest_ns=min(r.ready_ns for r in window.ready if r.rollout_id in trained))
        self._commit(window.ready, trained=trained, checkpoint=checkpoint, version=window.version, marks=marks)
        return self.output_dir / checkpoint

    def undo(self, step: int, got: Taken, batch: Any, marks: dict[str, str]) -> bool:
        """Back to the last good weights (the server still serves them); the update's rollouts quarantined."""
        cfg, state, window = self.config, self.state, got.own
        assert state is not None
        state.bad_updates = self.training.nonfinite.bad
        if state.checkpoint is not None:
            self.load_weights(state.checkpoint)
        else:
            self.algorithm.setup(model_path=Path(cfg.model), output_dir=self.output_dir / "algorithm", seed=cfg.seed)
        used = self._trained(batch, window.ready)
        self._commit(window.ready, trained={}, checkpoint=None, version=window.version,
                     marks={**marks, **dict.fromkeys(used, "bad_update")})
        return False  # no step: the next update is step ``step`` again

    @property
    def last_good(self) -> str:
        last = self.output_dir / self.state.checkpoint if self.state and self.state.checkpoint else self.config.model
        return f"The last good weights, {last}, are intact and still served"

    def report(self, step: int, got: Taken, batch: Any, row: dict[str, Any]) -> dict[str, Any] | None:
        """The update's row, once the server serves it: the Trainer's step figures and the online ones."""
        if batch is None:
            return None
        state, window = self.state, got.own
        assert state is not None
        self.guard.reloaded(row["policy_version"])
        self._prune_checkpoints()
        used = [r for r in window.ready if r.rollout_id in self._trained(batch, window.ready)]
        lags = [self._lag(r, window.version) for r in used]
        return {
            **row, "time": time.time(), "rollouts": len(used), "skipped": len(window.ready) - len(used),
            "reward_mean": sum(r.reward for r in used) / len(used),  # the ready query's latest usable reward
            "baseline_mean": state.baseline.mean, "policy_lag_mean": sum(lags) / len(lags) if lags else None,
            "combined_feedback": sum(1 for r in used if r.reward_count > 1), **dict(state.counters),
        }

    @staticmethod
    def _trained(batch: Any, ready: list[ReadyRollout]) -> dict[str, tuple[float, float]]:
        """Each trained rollout's (reward, advantage): identical credit, one advantage a rollout, off the columns."""
        table = batch.to_arrow()
        advantage = dict(zip(table.column("rollout_id").to_pylist(), table.column("advantage").to_pylist()))
        return {r.rollout_id: (float(r.reward or 0.0), advantage[r.rollout_id]) for r in ready
                if r.rollout_id in advantage}

    def _usable(self, rollout: ReadyRollout, version: int) -> bool:
        lag = self._lag(rollout, version)
        return lag is not None and lag <= self.config.max_policy_lag and _good_reward(rollout.reward) \
            and not self.guard.rejected(rollout)

    def _status(self, rollout: ReadyRollout, version: int, trained: dict[str, tuple[float, float]],
                marks: dict[str, str]) -> str:
        if rollout.rollout_id in trained:
            return "trained"
        if rollout.rollout_id in marks:
            return marks[rollout.rollout_id]
        if not _good_reward(rollout.reward):
            return "bad_reward"
        if self.guard.rejected(rollout):
            return "rejected_version"
        stale = rollout.min_policy_version is not None and not self._usable(rollout, version)
        return "stale" if stale else "no_transitions"

    @staticmethod
    def _lag(rollout: ReadyRollout, version: int) -> int | None:
        return None if rollout.min_policy_version is None else version - rollout.min_policy_version

    # --- persistence --------------------------------------------------------------------------------
    def _commit(self, considered: list[ReadyRollout], *, trained: dict[str, tuple[float, float]],
                checkpoint: str | None, version: int, marks: dict[str, str] | None = None) -> None:
        """Ledger lines for ``considered`` (in watermark order), then the state with the watermark past
        the last of them and ``checkpoint``: the commit point."""
        state, ledger = self._loaded("poll_once()")
        entries = []
        for r in considered:
            if r.rollout_id in ledger.seen:  # a guard, never expected: the watermark is already past it
                state.count("already_handled")
                continue
            status = self._status(r, version, trained, marks or {})
            state.count(status)
            entries.append({"rollout_id": r.rollout_id, "task_id": r.task_id, "step": state.step, "status": status,
                            "reward": r.reward, "rewards": r.reward_count, "policy_version": r.min_policy_version,
                            "policy_lag": self._lag(r, version),
                            "advantage": trained.get(r.rollout_id, (None, None))[1]})
        ledger.append(entries)
        if considered:
            state.watermark = Watermark(ready_ns=considered[-1].ready_ns, rollout_id=considered[-1].rollout_id)
        state.ledger_lines = ledger.lines
        if checkpoint is not None:
            state.checkpoint = checkpoint
        state.save(self.output_dir)

    def save_checkpoint(self, step: int) -> str:
        """Write ``checkpoint-<step>/`` (committed once ``online_state.json`` names it); returns its name."""
        path = checkpoints.path_of(self.output_dir, step)
        if path.exists():  # left by a crash before its commit
            shutil.rmtree(path)
        self.algorithm.save(path)
        return path.name

    def _prune_checkpoints(self) -> None:
        state, _ = self._loaded("poll_once()")
        needed = [state.checkpoint, state.trial["previous"] if state.trial else None]  # committed; a trial's base
        checkpoints.prune(self.output_dir, self.config.keep_checkpoints,
                          protect=[self.output_dir / name for name in needed if name])

