"""Command-line agents: one process per rollout (`CommandAgent`) or N long-lived workers on the jsonl
worker protocol (`WorkerPool`); each runs one rollout and answers ``(status, error)``. Used by
``runner.RolloutRunner``, which owns retries, readiness and the rollout's end."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spanrl import env
from spanrl.errors import ConfigError
from spanrl.rollouts.agent_env import otel_rollout_env
from spanrl.rollouts.rollouts import STATUS_CRASHED, STATUS_OK, STATUS_TIMEOUT

if TYPE_CHECKING:
    from spanrl.rollouts.runner import RolloutSpec

__all__ = ["CommandAgent", "WorkerPool", "command_argv"]


_STDERR_TAIL_LINES = 20


def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the process group the agent was started in (agent and its children)."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


class CommandAgent:
    """One process per rollout."""

    end_reason = "agent_exit"

    def __init__(self, argv: list[str], base_env: dict[str, str]) -> None:
        self.argv = argv
        self.base_env = base_env

    async def run(self, spec: RolloutSpec, timeout_s: float) -> tuple[str, str | None]:
        proc = await asyncio.create_subprocess_exec(
            *self.argv,
            env={**self.base_env, **spec.environ(), **otel_rollout_env(self.base_env, spec.ids())},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), timeout_s)
        except asyncio.TimeoutError:
            _kill(proc)
            await proc.wait()
            return STATUS_TIMEOUT, f"agent ran past {timeout_s:g} s; killed"
        if proc.returncode != 0:
            tail = "\n".join(stderr.decode(errors="replace").splitlines()[-_STDERR_TAIL_LINES:])
            return STATUS_CRASHED, f"agent exited with code {proc.returncode}: {tail}"
        return STATUS_OK, None

    async def close(self) -> None:
        pass


class _Worker:
    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: asyncio.subprocess.Process | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self.drain: asyncio.Task[None] | None = None


class WorkerPool:
    """N long-lived agent processes on the jsonl worker protocol."""

    end_reason = "agent_done"

    def __init__(self, argv: list[str], base_env: dict[str, str], workers: int) -> None:
        self.argv = argv
        self.base_env = {**base_env, env.SPANRL_AGENT_PROTOCOL: "jsonl"}
        self.workers = [_Worker(i) for i in range(workers)]
        self.idle: asyncio.Queue[_Worker] | None = None

    async def start(self) -> None:
        """Start every worker now (otherwise each starts with its first rollout)."""
        for worker in self.workers:
            await self._ensure(worker)

    async def _ensure(self, worker: _Worker) -> asyncio.subprocess.Process:
        if worker.proc is None or worker.proc.returncode is not None:
            worker.stderr_tail.clear()
            worker.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                env=self.base_env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                limit=2**24,
            )
            worker.drain = asyncio.ensure_future(self._drain_stderr(worker, worker.proc))
        return worker.proc

    @staticmethod
    async def _drain_stderr(worker: _Worker, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        async for line in proc.stderr:
            worker.stderr_tail.append(line.decode(errors="replace").rstrip())

    async def _answer(self, proc: asyncio.subprocess.Process, rollout_id: str) -> dict[str, Any] | None:
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                return None  # the worker exited
            try:
                answer = json.loads(line)
            except ValueError:
                continue  # the agent's own output
            if isinstance(answer, dict) and answer.get("spanrl_done") == rollout_id:
                return answer

    async def run(self, spec: RolloutSpec, timeout_s: float) -> tuple[str, str | None]:
        if self.idle is None:
            self.idle = asyncio.Queue()
            for worker in self.workers:
                self.idle.put_nowait(worker)
        worker = await self.idle.get()
        try:
            proc = await self._ensure(worker)
            assert proc.stdin is not None
            try:
                proc.stdin.write((json.dumps(spec.message()) + "\n").encode())
                await proc.stdin.drain()
                answer = await asyncio.wait_for(self._answer(proc, spec.rollout_id), timeout_s)
            except asyncio.TimeoutError:
                _kill(proc)
                await proc.wait()
                return STATUS_TIMEOUT, f"worker {worker.index} ran past {timeout_s:g} s on this rollout; restarted"
            except (BrokenPipeError, ConnectionResetError):
                answer = None
            if answer is None:
                await proc.wait()
                if worker.drain is not None:
                    await asyncio.wait([worker.drain], timeout=1.0)
                tail = "\n".join(worker.stderr_tail)
                return STATUS_CRASHED, f"worker {worker.index} exited with code {proc.returncode}: {tail}"
            if answer.get("error"):
                return STATUS_CRASHED, str(answer["error"])
            return STATUS_OK, None
        finally:
            self.idle.put_nowait(worker)

    async def close(self) -> None:
        """End every worker (end of its stdin; killed after 5 s): all at once, since an interpreter's exit takes
        0.3-1 s of CPU (the demo's four, one after the other, held the trainer's close for 1-8 s)."""
        live = [w.proc for w in self.workers if w.proc is not None and w.proc.returncode is None]
        for proc in live:
            if proc.stdin is not None:
                proc.stdin.close()
        await asyncio.gather(*(_stop(proc) for proc in live))
        self.idle = None


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Wait for a worker told to end (its stdin closed); past 5 s, kill it."""
    try:
        await asyncio.wait_for(proc.wait(), 5.0)
    except asyncio.TimeoutError:
        _kill(proc)
        await proc.wait()


def command_argv(command: str | Sequence[str], instrument: bool) -> list[str]:
    argv = shlex.split(command) if isinstance(command, str) else [str(part) for part in command]
    if not argv:
        raise ConfigError("agent command is empty")
    if instrument and Path(argv[0]).name != "opentelemetry-instrument":
        found = Path(sys.executable).parent / "opentelemetry-instrument"
        launcher = str(found) if found.exists() else shutil.which("opentelemetry-instrument")
        if launcher is None:
            raise ConfigError("instrument=True but no opentelemetry-instrument executable was found")
        argv = [launcher, *argv]
    return argv
