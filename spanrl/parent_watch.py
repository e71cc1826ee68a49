"""A child process that ends with the process that started it.

A Trainer starts its policy servers as ``spanrl serve`` subprocesses (``serving: {placement: process}``) and stops
them when it closes. A Trainer killed outright (SIGKILL, the OOM killer, a CI timeout) closes nothing, and its
servers went on serving nobody, holding their port, memory and any GPU. The Trainer names itself in
``SPANRL_PARENT_PID``; `watch_parent` (``spanrl serve`` calls it) sends its own process SIGTERM, the server's clean
shutdown, once its parent is gone (on POSIX an orphan is handed to another parent: ``os.getppid()`` changes), and
ends it outright if that stop takes longer than ``_GRACE_S``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from spanrl import env

__all__ = ["watch_parent"]

_logger = logging.getLogger(__name__)
_GRACE_S = 30.0
"""How long the clean stop may take once the parent is gone, before the process ends without it."""


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def watch_parent(*, interval_s: float = 1.0) -> threading.Thread | None:
    """With ``SPANRL_PARENT_PID`` set (and taken out of this process's environment, so nothing it starts inherits
    it): a daemon thread that sends this process SIGTERM once that process is no longer its parent; else None."""
    raw = os.environ.pop(env.SPANRL_PARENT_PID, None)
    if not raw:
        return None
    try:
        parent = int(raw)
    except ValueError:
        _logger.warning("%s=%r is not a process id; this process will not end with its parent",
                        env.SPANRL_PARENT_PID, raw)
        return None

    if os.getppid() != parent and _exists(parent):  # inherited from elsewhere: not the process that started us
        _logger.warning("%s=%d names a process that did not start this one; this process will not end with it",
                        env.SPANRL_PARENT_PID, parent)
        return None

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        _logger.warning("the process that started this one (pid %d) is gone: stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(_GRACE_S)  # a clean stop that hangs (spans to a collector that died with the parent): end it
        os._exit(128 + signal.SIGTERM)

    thread = threading.Thread(target=watch, name="spanrl-parent-watch", daemon=True)
    thread.start()
    return thread
