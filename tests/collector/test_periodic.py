"""The collector's one background-worker shape (collector/periodic.py), which the materializer and retention
share: it runs every interval, a failing run is logged with its first line and the next run still comes, and
shutdown stops it (safe before start and twice)."""

from __future__ import annotations

import logging
import threading

import pytest

from spanrl.collector.periodic import PeriodicWorker


class _Flaky(PeriodicWorker):
    def __init__(self) -> None:
        super().__init__(name="spanrl-test-worker", interval_s=0.01, doing="testing the worker")
        self.runs = 0
        self.third = threading.Event()

    def run_once(self) -> None:
        self.runs += 1
        if self.runs == 3:
            self.third.set()
        if self.runs == 1:
            raise RuntimeError("the store is reopening\nsecond line")


def test_a_failed_run_is_logged_and_the_next_one_comes(caplog: pytest.LogCaptureFixture) -> None:
    worker = _Flaky()
    worker.shutdown()  # before start: nothing to stop
    worker = _Flaky()
    with caplog.at_level(logging.WARNING):
        worker.start()
        assert worker.third.wait(10.0)
        worker.shutdown(5.0)
        worker.shutdown(5.0)  # twice is safe
    assert [r.getMessage() for r in caplog.records] == ["testing the worker failed: the store is reopening"]
    assert not worker._thread.is_alive()  # stopped: its thread has ended, so no run can come after shutdown
