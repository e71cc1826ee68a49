"""Shared fixtures. Others may append theirs below the collector's.

    collector_proc   `spanrl collector` as a SUBPROCESS on free ports with a tmp db (sql(), kill(), restart())
    collector_proc_factory   start(token=..., name=...) more such subprocesses
    collector        an in-process `Collector` on free ports with a tmp db
    tiny_model       the session's tiny model on the calculator's vocabulary (a folder; build it once)
    one_torch_thread one intra-op torch thread for a module (``pytestmark = pytest.mark.usefixtures(...)``)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

# `make test` runs the suite in several pytest-xdist workers: each takes its share of the cores for torch (and
# hands it to the agents and servers it starts), so two workers on two cores do not run four threads each.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // _workers))


# The longest test files (2026-12-03, two workers on 2 cores: the SmolLM2 tool agent's learning test alone 25
# minutes, the multiplication one 10, the demo 8, text-to-SQL 3, the wheel 3.7, the sweep 2.5), longest first.
LONGEST_FILES = ("tests/examples/test_smollm2_agentic.py", "tests/examples/test_smollm2_multiplication.py",
                 "tests/demo/test_demo.py", "tests/demo/test_demo_from_wheel.py",
                 "tests/examples/test_text2sql_train.py", "tests/sweep/test_sweep.py")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, longest files first: xdist hands out files by their number of tests, so the
    25-minute file started late and ended the run alone. A worker busy with one of them is given small files
    meanwhile (a worker is always sent its next file before its last test runs)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        def _assign_work_unit(self, node: Any) -> None:
            busy = any(scope in LONGEST_FILES and not all(tests.values())  # a long file not done yet
                       for scope, tests in self.assigned_work.get(node, {}).items())
            known = [scope for scope in LONGEST_FILES if scope in self.workqueue]
            if busy:  # the smallest file next: it waits behind the long one
                self.workqueue.move_to_end(min(self.workqueue, key=lambda s: len(self.workqueue[s])), last=False)
            elif known:
                self.workqueue.move_to_end(known[0], last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)


@pytest.fixture(scope="module")
def one_ray_at_a_time() -> Iterator[None]:
    """Held by each test module that starts Ray (``pytestmark = pytest.mark.usefixtures(...)``), across
    pytest-xdist workers: two local clusters at once overload two cores (a raylet misses Ray's registration
    deadline), and ``ray.init()`` without an address joins whichever cluster started last on the machine."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "spanrl-tests-ray.lock", "w") as lock:  # closing it unlocks
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield

@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model the Trainer tests train: the calculator's vocabulary, one layer. Nothing writes into it
    (runs write to their own output folder), so the whole session shares one."""
    from spanrl.demo.calculator.tasks import vocabulary
    from spanrl.demo.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", words=vocabulary(), hidden_size=32,
                            num_layers=1, num_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny models run fastest on one intra-op thread; on a busy 2-core machine two threads were 10x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


_READY_PREFIX = "spanrl collector ready"
_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0


class CollectorProcess:
    """A `spanrl collector` subprocess. Ports are chosen on first start and kept across restarts."""

    def __init__(self, db_path: Path, log_path: Path, *, token: str | None = None) -> None:
        self.db_path = db_path
        self.log_path = log_path
        self.token = token
        self.grpc_endpoint: str = ""
        self.http_endpoint: str = ""
        self._grpc_port = 0
        self._http_port = 0
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> "CollectorProcess":
        cmd = [sys.executable, "-m", "spanrl", "collector", "--db", str(self.db_path),
               "--grpc-port", str(self._grpc_port), "--http-port", str(self._http_port)]
        if self.token:
            cmd += ["--token", self.token]
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(_START_TIMEOUT_S)
        if not line or not line[0].startswith(_READY_PREFIX):
            self.proc.kill()
            raise RuntimeError(f"collector did not start: {line!r}; log:\n{self.log_path.read_text()[-3000:]}")
        fields = dict(part.split("=", 1) for part in line[0].split()[3:])
        self.grpc_endpoint = fields["grpc"]
        self.http_endpoint = fields["http"]
        self._grpc_port = int(self.grpc_endpoint.rsplit(":", 1)[1])
        self._http_port = int(self.http_endpoint.rsplit(":", 1)[1])
        return self

    def sql(self, query: str) -> list[dict[str, Any]]:
        """Rows through the collector's HTTP SQL endpoint."""
        headers = {"content-type": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(f"{self.http_endpoint}/v1/sql", data=json.dumps({"sql": query}).encode(),
                                     headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())["rows"]

    def kill(self) -> None:
        """SIGKILL, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(_STOP_TIMEOUT_S)

    def terminate(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(_STOP_TIMEOUT_S)

    def restart(self) -> "CollectorProcess":
        """Kill if running, then start again on the same db and ports."""
        self.kill()
        return self.start()


@pytest.fixture
def collector_proc(tmp_path: Path) -> Iterator[CollectorProcess]:
    proc = CollectorProcess(tmp_path / "spans.duckdb", tmp_path / "collector.log").start()
    try:
        yield proc
    finally:
        if proc.proc is not None and proc.proc.poll() is None:
            try:
                proc.terminate()
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def collector_proc_factory(tmp_path: Path) -> Iterator[Any]:
    """``start(token=None, name="spans") -> CollectorProcess``; every process is stopped at teardown."""
    started: list[CollectorProcess] = []

    def start(*, token: str | None = None, name: str = "spans") -> CollectorProcess:
        proc = CollectorProcess(tmp_path / f"{name}.duckdb", tmp_path / f"{name}.log", token=token).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc is not None and proc.proc.poll() is None:
            try:
                proc.terminate()
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Any]:
    from spanrl.collector import Collector, CollectorConfig

    c = Collector(CollectorConfig(db_path=str(tmp_path / "spans.duckdb"), grpc_port=0, http_port=0)).start()
    try:
        yield c
    finally:
        c.shutdown()
