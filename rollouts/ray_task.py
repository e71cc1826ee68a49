"""What runs on a Ray node for one rollout: a command agent's process (:func:`run_command`), a long-lived
jsonl worker held by an actor (:class:`JsonlWorker`), or a callable agent (:func:`run_callable`).

Standard library (and ray) only: the driver ships this module by value (``cloudpickle``'s
``register_pickle_by_value``), so a node needs nothing spanrl-specific for a command agent. A callable
agent imports spanrl's agent side (the base install, no torch) on the node, as it would in any process.
Each answers ``(status, error, node_id)``; the statuses are ``spanrl.rollouts.rollouts.STATUS_*``.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

OK, CRASHED, TIMEOUT = "ok", "crashed", "timeout"
_STDERR_TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1


def node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _child_setup() -> Any:
    """What the agent's process runs before exec: its own session (killed as a group) and, on Linux,
    SIGKILL when the Ray worker that started it dies (a node lost mid-rollout leaves no agent running).
    libc is looked up here, before the fork: the child only makes the call."""
    prctl = None
    if sys.platform.startswith("linux"):
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):  # pragma: no cover - agents then outlive a killed node's worker
            prctl = None

    def setup() -> None:
        os.setsid()
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return setup


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def node_argv(argv: list[str], instrument: bool) -> list[str]:
    """The command as this node runs it: a Python the driver named but this node lacks is this node's
    Python, and ``opentelemetry-instrument`` is found next to this node's Python or on its PATH."""
    argv = list(argv)
    if not Path(argv[0]).exists() and Path(argv[0]).name.startswith("python") and os.sep in argv[0]:
        argv[0] = sys.executable
    if instrument and Path(argv[0]).name != "opentelemetry-instrument":
        found = Path(sys.executable).parent / "opentelemetry-instrument"
        launcher = str(found) if found.exists() else shutil.which("opentelemetry-instrument")
        if launcher is None:
            raise FileNotFoundError(f"instrument=True but no opentelemetry-instrument executable on node {node_id()}")
        argv = [launcher, *argv]
    return argv


def run_command(argv: list[str], instrument: bool, env: dict[str, str], timeout_s: float) -> tuple[str, Any, str]:
    """One process for one rollout, in a fresh working directory, with this node's environment plus ``env``."""
    node = node_id()
    workdir = tempfile.mkdtemp(prefix="spanrl-rollout-")
    try:
        try:
            proc = subprocess.Popen(node_argv(argv, instrument), env={**os.environ, **env}, cwd=workdir,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    preexec_fn=_child_setup())
        except OSError as exc:
            return CRASHED, f"could not run the agent: {type(exc).__name__}: {exc}", node
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.wait()
            return TIMEOUT, f"agent ran past {timeout_s:g} s; killed", node
        if proc.returncode != 0:
            tail = "\n".join(stderr.decode(errors="replace").splitlines()[-_STDERR_TAIL_LINES:])
            return CRASHED, f"agent exited with code {proc.returncode}: {tail}", node
        return OK, None, node
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class JsonlWorker:
    """A Ray actor holding one long-lived agent process on the jsonl worker protocol (restarted after a
    crash or a timeout), in its own working directory."""

    def __init__(self, argv: list[str], instrument: bool, env: dict[str, str]) -> None:
        self.argv, self.instrument, self.env = argv, instrument, env
        self.workdir = tempfile.mkdtemp(prefix="spanrl-worker-")
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)

    def _ensure(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.tail.clear()
            self.lines = queue.Queue()
            self.proc = subprocess.Popen(node_argv(self.argv, self.instrument), env={**os.environ, **self.env},
                                         cwd=self.workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, preexec_fn=_child_setup())
            threading.Thread(target=self._read, args=(self.proc.stdout, self.lines), daemon=True).start()
            threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()
        return self.proc

    @staticmethod
    def _read(stream: Any, lines: queue.Queue[bytes | None]) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)  # the worker exited

    def _drain(self, stream: Any) -> None:
        for line in stream:
            self.tail.append(line.decode(errors="replace").rstrip())

    def run(self, message: dict[str, Any], timeout_s: float) -> tuple[str, Any, str]:
        node, rollout_id = node_id(), message["rollout_id"]
        try:
            proc = self._ensure()
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(message) + "\n").encode())
            proc.stdin.flush()
        except OSError as exc:
            return CRASHED, f"could not run the agent: {type(exc).__name__}: {exc}", node
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                _kill(proc)
                proc.wait()
                return TIMEOUT, f"worker ran past {timeout_s:g} s on this rollout; restarted", node
            if line is None:
                proc.wait()
                time.sleep(0.1)  # the stderr reader's last lines
                return CRASHED, f"worker exited with code {proc.returncode}: " + "\n".join(self.tail), node
            try:
                answer = json.loads(line)
            except ValueError:
                continue  # the agent's own output
            if isinstance(answer, dict) and answer.get("spanrl_done") == rollout_id:
                return (CRASHED, str(answer["error"]), node) if answer.get("error") else (OK, None, node)

    def close(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                _kill(proc)
                proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


_TRACING_AT: list[Any] = []  # the collector (and headers) this worker process's in-process spans go to


def run_callable(fn: Any, spec: dict[str, Any], endpoint: str, timeout_s: float,
                 headers: dict[str, str] | None = None) -> tuple[str, Any, str]:
    """A callable agent's rollout in this Ray worker, its spans sent to the collector at ``endpoint`` and
    flushed before answering (the driver then waits for them in the store, as for a local rollout)."""
    import asyncio

    from spanrl.instrumentation import flush
    from spanrl.rollouts.rollouts import RolloutSpec
    from spanrl.rollouts.callable_agent import CallableAgent
    from spanrl.rollouts.tracing import InProcessTracing

    if _TRACING_AT != [endpoint, headers]:
        InProcessTracing.point_at(endpoint, headers)
        _TRACING_AT[:] = [endpoint, headers]
    workdir, home = tempfile.mkdtemp(prefix="spanrl-rollout-"), os.getcwd()
    os.chdir(workdir)  # a Ray worker runs one task at a time
    try:
        status, error = asyncio.run(CallableAgent(fn).run(RolloutSpec(**spec), timeout_s))
    finally:
        flush()
        os.chdir(home)
        shutil.rmtree(workdir, ignore_errors=True)
    return status, error, node_id()
