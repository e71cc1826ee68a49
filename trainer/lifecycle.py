"""The lifecycle both trainers share (``Trainer``, ``OnlineTrainer``): one enum, one table of why a call is
refused in each state, closing every reporting callback, and ``with`` (start, then close)."""

from __future__ import annotations

import enum
import logging
from typing import Any, ClassVar

from spanrl.errors import TrainingError

__all__ = ["Lifecycle", "State"]

_logger = logging.getLogger(__name__)


class State(enum.Enum):
    """Where a trainer is in its life; a call that does not fit the state is refused, naming it."""

    NEW = "new"  # constructed, nothing started
    RUNNING = "running"  # started: services up (Trainer rank 0), or state and policy loaded (online)
    TRAINING = "training"  # inside train() / run()
    FOLLOWING = "following"  # a Trainer rank other than 0: only the algorithm, updating on rank 0's batches
    CLOSED = "closed"  # stopped; start() (or train() / run()) starts again


_WHY = {
    State.NEW: "nothing is {ready} yet; call start() or {loop} first",
    State.TRAINING: "{loop} is already running",
    State.FOLLOWING: "this process is not rank 0; only rank 0 runs rollouts, evaluates, saves and deploys",
    State.CLOSED: "it was closed; call start() or {loop} to {ready_again} again",
    State.RUNNING: "",
}


class Lifecycle:
    """The shared part of a trainer's lifecycle. A subclass names its loop (``train()`` / ``run()``), what
    ``start()`` makes ready, and the attribute holding its `State` (the online trainer's ``state`` is its
    committed state, so its lifecycle is ``lifecycle``)."""

    _WORDS: ClassVar[dict[str, str]]  # loop, ready, ready_again
    _STATE_FIELD: ClassVar[str]
    _callbacks: list[Any]

    def start(self) -> Any:  # pragma: no cover - each trainer's own
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - each trainer's own
        raise NotImplementedError

    def _refuse(self, action: str, *states: State) -> None:
        now = getattr(self, self._STATE_FIELD)
        if now in states:
            raise TrainingError(f"cannot {action} in state {now.name}: {_WHY[now].format(**self._WORDS)}")

    def _close_callbacks(self) -> None:
        """Close every reporting callback, each even when one before it fails."""
        for callback in self._callbacks:
            try:
                callback.close()
            except Exception:  # closing must go on
                _logger.exception("could not close %s", type(callback).__name__)
        self._callbacks = []

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
