"""The rollout runner: run an agent once per rollout, bounded and concurrent, until its spans are stored.

An agent is either a Python callable ``agent(task, llm)`` (sync or async; runs in this process inside a
``spanrl.rollout`` context; a returned number is emitted as the reward) or a command line in any
language, started with the rollout's environment:

    SPANRL_ROLLOUT_ID, SPANRL_TASK_ID, SPANRL_TASK (JSON), SPANRL_ATTEMPT, SPANRL_MODE, SPANRL_MODEL,
    SPANRL_SAMPLING (JSON), OPENAI_BASE_URL=<llm>/rollouts/<rollout_id>/v1, OPENAI_API_KEY, OTEL_*,
    and SPANRL_PROMPT_TEMPLATE when the trainer gives the agent a prompt template (APO)

A command runs once per rollout, or (``workers=N``) as N long-lived workers speaking the *jsonl worker
protocol*: the runner sets ``SPANRL_AGENT_PROTOCOL=jsonl``, writes one JSON object per rollout on the
worker's stdin (keys ``rollout_id task_id task attempt mode base_url model sampling prompt_template``,
the last one null without a template) and waits for a
stdout line ``{"spanrl_done": "<rollout_id>"}`` (an ``"error"`` key marks a failed rollout). Other
stdout lines are ignored. This saves the interpreter and instrumentation start-up of every rollout.

A rollout is *ok* once the agent has finished and its reward is committed in the store (and, when
``require_token_spans``, a span with completion token ids from the policy server). A rollout that
crashes, hangs past ``rollout_timeout_s``, or leaves no reward within ``span_timeout_s`` is recorded
with its status and retried under a fresh rollout id, up to ``max_attempts``; it never raises.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import inspect
import json
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spanrl import env
from spanrl.errors import ConfigError

__all__ = [
    "LLMEndpoint",
    "RolloutJob",
    "RolloutResult",
    "RolloutRunner",
    "RolloutSpec",
    "RunnerConfig",
]

STATUS_OK = "ok"
STATUS_CRASHED = "crashed"  # the agent raised or its process exited non-zero
STATUS_TIMEOUT = "timeout"  # the agent ran past rollout_timeout_s
STATUS_NO_REWARD = "no_reward"  # the agent finished but no reward reached the store in span_timeout_s

_POLL_INTERVAL_S = 0.1
_WATERMARK_MARGIN_NS = 2_000_000_000  # clock skew allowance for "spans stored since this run began"
_STDERR_TAIL_LINES = 20
_BSP_SCHEDULE_DELAY_MILLIS = 100  # agents export spans promptly: the trainer waits for them

AgentFn = Callable[[Any, "LLMEndpoint"], Any]
ReadyFn = Callable[[Sequence[str], int], set[str]]


@dataclasses.dataclass
class RunnerConfig:
    """How rollouts are run."""

    max_concurrency: int = 8
    """Rollouts in flight at once."""
    rollout_timeout_s: float = 60.0
    """Wall-clock limit of one rollout's agent run; past it the rollout is ``timeout`` (its process killed)."""
    span_timeout_s: float = 10.0
    """After the agent finishes, how long to wait for its reward to be committed in the store."""
    max_attempts: int = 3
    """Attempts per rollout (1 = no retry)."""
    workers: int = 0
    """Command agents: 0 starts one process per rollout; N keeps N workers on the jsonl protocol."""
    instrument: bool = True
    """Prefix a command with ``opentelemetry-instrument`` (unless it already starts with it)."""
    require_token_spans: bool = True
    """A rollout is only ok once a span with completion token ids (from the policy server) is stored."""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Extra environment for command agents."""

    def validate(self) -> None:
        if not isinstance(self.max_concurrency, int) or self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be a positive integer, got {self.max_concurrency!r}")
        for name in ("rollout_timeout_s", "span_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be a positive integer, got {self.max_attempts!r}")
        if not isinstance(self.workers, int) or self.workers < 0:
            raise ConfigError(f"workers must be a non-negative integer, got {self.workers!r}")


@dataclasses.dataclass(frozen=True)
class LLMEndpoint:
    """The LLM a rollout talks to, as given to a callable agent (``agent(task, llm)``)."""

    base_url: str
    """OpenAI base URL for this rollout (``.../rollouts/<rollout_id>/v1``)."""
    model: str
    api_key: str = "spanrl"
    sampling: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Sampling parameters the trainer asks for, e.g. ``{"temperature": 1.0, "max_tokens": 8}``."""
    prompt_template: str | None = None
    """The prompt template the agent should use (``str.format`` fields filled from the task), or None
    for its own; set by the Trainer (``prompt_template=``, and each candidate APO scores)."""

    def client(self) -> Any:
        """An ``openai.OpenAI`` client for this endpoint."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)

    def async_client(self) -> Any:
        """An ``openai.AsyncOpenAI`` client for this endpoint."""
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)


@dataclasses.dataclass(frozen=True)
class RolloutJob:
    """One rollout to run: a task (JSON-serialisable) and its id."""

    task_id: str
    task: Any


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """One attempt of one rollout, as the agent sees it."""

    rollout_id: str
    task_id: str
    task: Any
    attempt: int
    mode: str
    base_url: str
    model: str
    sampling: dict[str, Any]
    prompt_template: str | None = None

    def message(self) -> dict[str, Any]:
        """The jsonl worker protocol's request line."""
        return dataclasses.asdict(self)

    def environ(self) -> dict[str, str]:
        """The ``SPANRL_*`` and ``OPENAI_*`` variables of this rollout."""
        return {
            env.SPANRL_ROLLOUT_ID: self.rollout_id,
            env.SPANRL_TASK_ID: self.task_id,
            env.SPANRL_TASK: json.dumps(self.task),
            env.SPANRL_ATTEMPT: str(self.attempt),
            env.SPANRL_MODE: self.mode,
            env.SPANRL_MODEL: self.model,
            env.SPANRL_SAMPLING: json.dumps(self.sampling),
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": "spanrl",
            **({env.SPANRL_PROMPT_TEMPLATE: self.prompt_template} if self.prompt_template is not None else {}),
        }


@dataclasses.dataclass
class RolloutResult:
    """What happened to one attempt."""

    rollout_id: str
    task_id: str
    attempt: int
    mode: str
    status: str
    """``ok``, ``crashed``, ``timeout`` or ``no_reward``."""
    duration_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK


class _CallableAgent:
    def __init__(self, fn: AgentFn) -> None:
        self.fn = fn

    def _enter(self, spec: RolloutSpec) -> Any:
        from spanrl.instrumentation import rollout

        return rollout(rollout_id=spec.rollout_id, task_id=spec.task_id, attempt=spec.attempt, mode=spec.mode)

    def _finish(self, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            from spanrl.instrumentation import emit_reward

            emit_reward(float(value))

    async def run(self, spec: RolloutSpec, timeout_s: float) -> tuple[str, str | None]:
        llm = LLMEndpoint(
            base_url=spec.base_url, model=spec.model, sampling=dict(spec.sampling), prompt_template=spec.prompt_template
        )
        try:
            if inspect.iscoroutinefunction(self.fn):

                async def call() -> None:
                    with self._enter(spec):
                        self._finish(await self.fn(spec.task, llm))

                await asyncio.wait_for(call(), timeout_s)
            else:

                def call_sync() -> None:
                    with self._enter(spec):
                        self._finish(self.fn(spec.task, llm))

                # A sync agent past its timeout keeps its thread until it returns; its result is ignored.
                await asyncio.wait_for(asyncio.to_thread(call_sync), timeout_s)
        except asyncio.TimeoutError:
            return STATUS_TIMEOUT, f"agent ran past {timeout_s:g} s"
        except Exception as exc:  # the user's agent failed: record it, retry
            return STATUS_CRASHED, f"{type(exc).__name__}: {exc}"
        return STATUS_OK, None

    async def close(self) -> None:
        pass


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


class _CommandAgent:
    """One process per rollout."""

    def __init__(self, argv: list[str], base_env: dict[str, str]) -> None:
        self.argv = argv
        self.base_env = base_env

    async def run(self, spec: RolloutSpec, timeout_s: float) -> tuple[str, str | None]:
        proc = await asyncio.create_subprocess_exec(
            *self.argv,
            env={**self.base_env, **spec.environ()},
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


class _WorkerPool:
    """N long-lived agent processes on the jsonl worker protocol."""

    def __init__(self, argv: list[str], base_env: dict[str, str], workers: int) -> None:
        self.argv = argv
        self.base_env = {**base_env, env.SPANRL_AGENT_PROTOCOL: "jsonl"}
        self.workers = [_Worker(i) for i in range(workers)]
        self.idle: asyncio.Queue[_Worker] | None = None

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
        for worker in self.workers:
            proc = worker.proc
            if proc is None or proc.returncode is not None:
                continue
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except asyncio.TimeoutError:
                _kill(proc)
                await proc.wait()
        self.idle = None


def _command_argv(command: str | Sequence[str], instrument: bool) -> list[str]:
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


class RolloutRunner:
    """Runs rollouts of one agent; reuse it across steps (command workers stay alive), then ``close()``."""

    def __init__(
        self,
        agent: AgentFn | str | Sequence[str],
        *,
        config: RunnerConfig,
        ready: ReadyFn,
        otel_env: dict[str, str] | None = None,
        flush: Callable[[], Any] | None = None,
    ) -> None:
        """``ready(rollout_ids, since_ns)`` returns the ids whose spans are committed (only spans
        ingested at or after ``since_ns`` need to be looked at); ``flush`` (e.g. the policy server's
        ``force_flush``) runs before each check; ``otel_env`` is the ``OTEL_*`` environment."""
        config.validate()
        self.config = config
        self._ready = ready
        self._flush = flush
        self._loop = asyncio.new_event_loop()
        if callable(agent):
            self._agent: Any = _CallableAgent(agent)
        elif isinstance(agent, (str, list, tuple)):
            base_env = {
                **os.environ,
                "OTEL_BSP_SCHEDULE_DELAY": str(_BSP_SCHEDULE_DELAY_MILLIS),
                **(otel_env or {}),
                **config.env,
            }
            argv = _command_argv(agent, config.instrument)
            self._agent = _WorkerPool(argv, base_env, config.workers) if config.workers else _CommandAgent(argv, base_env)
        else:
            raise ConfigError(f"agent must be a callable or a command line, got {type(agent).__name__}")

    def run(
        self,
        jobs: Sequence[RolloutJob],
        *,
        id_prefix: str,
        llm_url: Any,
        model: str,
        sampling: dict[str, Any],
        mode: str = "train",
        on_result: Callable[[RolloutResult], None] | None = None,
        prompt_template: str | None = None,
    ) -> list[RolloutResult]:
        """Run every job (retrying failures); return every attempt's result, in completion order.

        Rollout ids are ``{id_prefix}{index}-a{attempt}``; each talks to ``{llm_url}/rollouts/{id}/v1``
        (``llm_url``: a server root, or a ``PolicyPool`` that leases one of its servers per rollout).
        ``prompt_template`` reaches the agent (``llm.prompt_template`` / ``SPANRL_PROMPT_TEMPLATE``).
        """
        return self._loop.run_until_complete(
            self._run(
                jobs, id_prefix=id_prefix, llm_url=llm_url, model=model, sampling=sampling, mode=mode,
                on_result=on_result, prompt_template=prompt_template,
            )
        )

    def close(self) -> None:
        """Stop command workers; safe twice."""
        if self._loop.is_closed():
            return
        self._loop.run_until_complete(self._agent.close())
        self._loop.close()

    async def _run(
        self,
        jobs: Sequence[RolloutJob],
        *,
        id_prefix: str,
        llm_url: Any,
        model: str,
        sampling: dict[str, Any],
        mode: str,
        on_result: Callable[[RolloutResult], None] | None,
        prompt_template: str | None = None,
    ) -> list[RolloutResult]:
        results: list[RolloutResult] = []
        slots = asyncio.Semaphore(self.config.max_concurrency)
        waiter = _SpanWaiter(self._ready, self._flush, since_ns=time.time_ns() - _WATERMARK_MARGIN_NS)
        # A str is one server's root; a PolicyPool (anything with lease()) spreads rollouts over its servers.
        lease = llm_url.lease if hasattr(llm_url, "lease") else (lambda: contextlib.nullcontext(llm_url.rstrip("/")))

        async def one(index: int, job: RolloutJob) -> None:
            for attempt in range(1, self.config.max_attempts + 1):
                rollout_id = f"{id_prefix}{index}-a{attempt}"
                start = time.monotonic()
                async with slots:
                    with lease() as root:  # one policy server for all of this rollout's calls
                        spec = RolloutSpec(
                            rollout_id=rollout_id,
                            task_id=job.task_id,
                            task=job.task,
                            attempt=attempt,
                            mode=mode,
                            base_url=f"{root}/rollouts/{rollout_id}/v1",
                            model=model,
                            sampling=dict(sampling),
                            prompt_template=prompt_template,
                        )
                        try:
                            status, error = await self._agent.run(spec, self.config.rollout_timeout_s)
                        except Exception as exc:  # e.g. the agent could not be started, or wrote garbage
                            status, error = STATUS_CRASHED, f"could not run the agent: {type(exc).__name__}: {exc}"
                if status == STATUS_OK and not await waiter.wait(rollout_id, self.config.span_timeout_s):
                    status, error = STATUS_NO_REWARD, f"no reward stored within {self.config.span_timeout_s:g} s"
                result = RolloutResult(rollout_id, job.task_id, attempt, mode, status, time.monotonic() - start, error)
                results.append(result)
                if on_result is not None:
                    on_result(result)
                if result.ok:
                    return

        poller = asyncio.ensure_future(waiter.poll())
        try:
            await asyncio.gather(*(one(i, job) for i, job in enumerate(jobs)))
        finally:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        return results


class _SpanWaiter:
    """One poller for all rollouts waiting for their spans: one store query per round, not one each."""

    def __init__(self, ready: ReadyFn, flush: Callable[[], Any] | None, *, since_ns: int) -> None:
        self._ready = ready
        self._since_ns = since_ns
        self._flush = flush
        self._pending: dict[str, asyncio.Future[bool]] = {}
        self._wake = asyncio.Event()

    async def wait(self, rollout_id: str, timeout_s: float) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending[rollout_id] = future
        self._wake.set()
        try:
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            return False
        finally:
            self._pending.pop(rollout_id, None)

    async def poll(self) -> None:
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
            ids = list(self._pending)
            if self._flush is not None:
                await asyncio.to_thread(self._flush)
            done = await asyncio.to_thread(self._ready, ids, self._since_ns)
            for rollout_id in done:
                future = self._pending.get(rollout_id)
                if future is not None and not future.done():
                    future.set_result(True)
            await asyncio.sleep(_POLL_INTERVAL_S)

