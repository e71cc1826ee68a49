"""The lifecycle both trainers share (``Trainer``, ``OnlineTrainer``): one enum, each state named in the
error that refuses a call which does not fit it."""

from __future__ import annotations

import enum

__all__ = ["TRAINER_REFUSALS", "State"]


class State(enum.Enum):
    """Where a trainer is in its life; a call that does not fit the state is refused, naming it."""

    NEW = "new"  # constructed, nothing started
    RUNNING = "running"  # started: services up (Trainer rank 0), or state and policy loaded (online)
    TRAINING = "training"  # inside train() / run()
    FOLLOWING = "following"  # a Trainer rank other than 0: only the algorithm, updating on rank 0's batches
    CLOSED = "closed"  # stopped; start() (or train() / run()) starts again


TRAINER_REFUSALS = {
    State.NEW: "nothing is set up yet; call start() or train() first",
    State.TRAINING: "train() is already running",
    State.FOLLOWING: "this process is not rank 0; only rank 0 runs rollouts, evaluates, saves and deploys",
    State.RUNNING: "",
    State.CLOSED: "",
}
"""Why the ``Trainer`` refuses a call in each state (named in the error)."""
