"""Async steps: later steps' rollouts run on a background thread while the current update computes.

The Trainer asks for step ``s``'s rollouts with :meth:`RolloutPrefetch.take` (already run ahead, or run
now in the caller's thread), then calls :meth:`RolloutPrefetch.ahead`, which starts the rollouts of
steps ``s+1 .. s+bound`` (never past the last step) on one background thread, one step's batch after
another, while the caller builds the batch, updates and reloads the server. A rollout started ahead
samples from a policy at most ``bound`` updates older than the one its step updates: GRPO's clipped
importance ratio uses the server's recorded log-probs, so it corrects for that lag. ``bound = 0`` is
the synchronous loop (nothing runs ahead).

The runner runs one batch at a time (one event loop, one worker pool), so the Trainer's other rollouts
(evaluation, ``collect``) first :meth:`settle` what runs ahead. Results still pending at :meth:`close`
are dropped, never trained: a run resumed from a checkpoint runs those steps again under new ids.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pyarrow.compute as pc

from spanrl.rollouts.rollouts import RolloutResult

__all__ = ["RolloutPrefetch", "StepRollouts", "policy_lag"]


@dataclasses.dataclass(frozen=True)
class StepRollouts:
    """One step's rollouts: every attempt's result, the policy version when they started, their seconds."""

    results: list[RolloutResult]
    policy_version: int | None
    seconds: float


class RolloutPrefetch:
    """Runs ``run(step)`` for up to ``bound`` steps ahead of the caller, on one background thread."""

    def __init__(self, run: Callable[[int], StepRollouts], *, bound: int, last_step: int) -> None:
        self._run = run
        self.bound = bound
        self._last_step = last_step
        self._pending: dict[int, concurrent.futures.Future[StepRollouts]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spanrl-rollouts") if bound else None

    def take(self, step: int) -> tuple[StepRollouts, float]:
        """Step ``step``'s rollouts and the seconds the caller waited for them."""
        started = time.perf_counter()
        future = self._pending.pop(step, None)
        got = future.result() if future is not None else self._run(step)
        return got, time.perf_counter() - started

    def ahead(self, step: int) -> None:
        """Start the rollouts of steps ``step+1 .. step+bound`` not started yet (the caller is at ``step``)."""
        if self._pool is None:
            return
        for later in range(step + 1, min(step + self.bound, self._last_step) + 1):
            if later not in self._pending:
                self._pending[later] = self._pool.submit(self._run, later)

    def settle(self) -> None:
        """Wait until nothing runs ahead (results are kept for :meth:`take`); the runner is then free."""
        concurrent.futures.wait(list(self._pending.values()))

    def close(self) -> None:
        """Wait for the batch in flight, drop what is pending; safe twice."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()


def policy_lag(batch: Any, version: int | None) -> dict[str, int]:
    """The oldest policy version in ``batch`` (a TransitionBatch) and how many updates it lags ``version``
    (the policy the update starts from): ``rollout_policy_version`` and ``policy_lag`` for the history row."""
    oldest = pc.min(batch.to_arrow().column("policy_version")).as_py()
    if version is None or oldest is None:
        return {}
    return {"rollout_policy_version": oldest, "policy_lag": version - oldest}
