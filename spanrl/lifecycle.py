"""One lifecycle for spanrl's services (the collector, the policy server, its generation batcher): three
states, one lock, a call that does not fit the state refused naming it, and one stop verb, ``shutdown``,
safe before ``start`` and twice: ``cannot ACTION a WHAT that is STATE``.

The trainers' lifecycle (``trainer/lifecycle.py``) is a second one on purpose: a service is single-use (STOPPED is
final, "create a new one": a collector's or server's port, threads and file are released for good), a trainer is
restartable (CLOSED, then ``start()`` or ``train()`` again: its services started anew, its step and history, or
committed state, kept), and it has states no service has: TRAINING (inside its loop) and FOLLOWING (a rank other
than 0). One state set would either let a stopped service start again or forbid a closed trainer to; the stop verbs
follow the same line (``shutdown(timeout)``: a service flushes within a time; ``close()``: a trainer's ``with``)."""

from __future__ import annotations

import enum
import threading

from spanrl.errors import SpanRLError

__all__ = ["Lifecycle", "State"]


class State(enum.Enum):
    """Where a service is in its life."""

    NEW = "new"  # constructed, nothing started
    RUNNING = "running"  # started
    STOPPED = "stopped"  # shut down; a new instance starts again


class Lifecycle:
    """A service's state, moved under one lock. ``what`` names the service and ``error`` is the type its
    refusals raise (``CollectorError``, ``ServingError``)."""

    def __init__(self, what: str, error: type[SpanRLError]) -> None:
        self.what = what
        self._error = error
        self._lock = threading.Lock()
        self.state = State.NEW

    def begin(self, *, again: bool = False) -> bool:
        """Claim the start: NEW -> RUNNING, True. RUNNING: False when ``again`` (a second start is a no-op),
        else refused; STOPPED: refused (a stopped service is not started again)."""
        with self._lock:
            if self.state is State.RUNNING and again:
                return False
            if self.state is not State.NEW:
                raise self._error(f"cannot start a {self.what} that is {self.state.value}; create a new one")
            self.state = State.RUNNING
            return True

    def end(self) -> bool:
        """Claim the stop: True the first time (the caller then stops its parts), False after."""
        with self._lock:
            if self.state is State.STOPPED:
                return False
            self.state = State.STOPPED
            return True

    def refuse(self, action: str, *states: State) -> None:
        """Raise the service's error when it is in one of ``states``, naming the action and the state."""
        state = self.state
        if state in states:
            raise self._error(f"cannot {action} a {self.what} that is {state.value}")
