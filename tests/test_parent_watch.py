"""``spanrl/parent_watch.py``: a process started with ``SPANRL_PARENT_PID`` ends with that parent; a value naming
another live process (inherited from elsewhere) is refused with a warning, not acted on. The whole path, a real
Trainer-like parent killed outright: tests/rollouts/test_process_serving.py."""

from __future__ import annotations

import logging
import os

import pytest

from spanrl import env
from spanrl.parent_watch import watch_parent


def test_a_pid_of_another_live_process_is_not_watched(monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(env.SPANRL_PARENT_PID, str(os.getpid()))  # alive, and not this process's parent
    with caplog.at_level(logging.WARNING, logger="spanrl.parent_watch"):
        assert watch_parent() is None
    assert env.SPANRL_PARENT_PID not in os.environ  # taken out: nothing this process starts inherits it
    assert f"SPANRL_PARENT_PID={os.getpid()} names a process that did not start this one" in caplog.text


def test_no_variable_or_a_bad_one_watches_nothing(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(env.SPANRL_PARENT_PID, raising=False)
    assert watch_parent() is None
    monkeypatch.setenv(env.SPANRL_PARENT_PID, "trainer")
    with caplog.at_level(logging.WARNING, logger="spanrl.parent_watch"):
        assert watch_parent() is None
    assert "SPANRL_PARENT_PID='trainer' is not a process id" in caplog.text


def test_the_real_parent_is_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.SPANRL_PARENT_PID, str(os.getppid()))
    thread = watch_parent(interval_s=0.05)
    assert thread is not None and thread.daemon and thread.is_alive()  # ends with this process
