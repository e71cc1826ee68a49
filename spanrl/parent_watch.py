"""A child process that ends with the process that started it.

A Trainer starts its policy servers as ``spanrl serve`` subprocesses (``serving: {placement: process}``) and stops
them when it closes. A Trainer killed outright (SIGKILL, the OOM killer, a CI timeout) closes nothing, and its
servers went on serving nobody, holding their port, memory and any GPU. The Trainer names itself in
``SPANRL_PARENT_PID``; `watch_parent` (``spanrl serve`` calls it) sends its own process SIGTERM, the server's clean
shutdown, once its parent is gone (on POSIX an orphan is handed to another parent: ``os.getppid()`` changes).
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

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        _logger.warning("the process that started this one (pid %d) is gone: stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="spanrl-parent-watch", daemon=True)
    thread.start()
    return thread
