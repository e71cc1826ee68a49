"""The rollout runner: run an agent once per rollout, bounded and concurrent, until its spans are stored.

An agent is either a Python callable ``agent(task, llm)`` (sync or async; runs in this process inside a
``spanrl.rollout`` context; a returned number is emitted as the reward) or a command line in any
language, started with the rollout's environment:

    SPANRL_ROLLOUT_ID, SPANRL_TASK_ID, SPANRL_TASK (JSON), SPANRL_ATTEMPT, SPANRL_MODE, SPANRL_MODEL,
    SPANRL_SAMPLING (JSON), SPANRL_MODEL_<AGENT> (per-agent policies),
    OPENAI_BASE_URL=<llm>/rollouts/<rollout_id>/v1 (``.../rollouts/<rollout_id>/seeds/<seed>/v1`` and
    SPANRL_SEED for a seeded job, ``spanrl.seeding``), OPENAI_API_KEY,
    ANTHROPIC_BASE_URL=<llm>/rollouts/<rollout_id>[/seeds/<seed>], ANTHROPIC_API_KEY, OTEL_*,
    and SPANRL_PROMPT_TEMPLATE when the trainer gives the agent a prompt template (APO); the rollout ids
    also go in the standard OTEL_RESOURCE_ATTRIBUTES (merged with the user's), so any OTel SDK tags every
    span with no spanrl in the agent (agent_env.py)

A command runs once per rollout, or (``workers=N``) as N long-lived workers speaking the *jsonl worker
protocol*: the runner sets ``SPANRL_AGENT_PROTOCOL=jsonl``, writes one JSON object per rollout on the
worker's stdin (keys ``rollout_id task_id task attempt mode base_url model sampling prompt_template
agent_models seed api_key``, ``prompt_template`` and ``seed`` null when the run gives none) and waits for a
stdout line ``{"spanrl_done": "<rollout_id>"}`` (an ``"error"`` key marks a failed rollout). Other
stdout lines are ignored. This saves the interpreter and instrumentation start-up of every rollout.

A rollout is *ok* once the agent has finished, its end and its reward are committed in the store
(and, when ``require_token_spans``, a span with completion token ids from the policy server). Its end is
its ``spanrl.rollout`` span, or what ``on_end`` stores when a command agent exits or a worker answers
(``spanrl.store.rollouts.record_ends``: the ends since the last check, in one commit, at the start of the
next check); in-process spans are flushed before each check. A rollout that
crashes, hangs past ``rollout_timeout_s``, or leaves no reward within ``span_timeout_s`` is recorded
with its status and retried under a fresh rollout id, up to ``max_attempts``; it never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from spanrl import semconv
from spanrl.errors import ConfigError
from spanrl.seeding import derive_seed
from spanrl.rollouts.agent_env import agent_credentials, agent_service_env, kept_ingest_header
from spanrl.rollouts.agent_processes import CommandAgent, WorkerPool, command_argv
from spanrl.rollouts.callable_agent import CallableAgent
from spanrl.rollouts.rollouts import (
    STATUS_CRASHED,
    STATUS_NO_REWARD,
    STATUS_OK,
    STATUS_TIMEOUT,
    AgentFn,
    LLMEndpoint,
    RolloutJob,
    RolloutResult,
    RolloutSpec,
    RolloutsConfig,
    RunnerConfig,
)

__all__ = [
    "LLMEndpoint",
    "RolloutJob",
    "RolloutResult",
    "RolloutRunner",
    "RolloutSpec",
    "RunnerConfig",
]


_POLL_INTERVAL_S = 0.1  # between checks once every agent of the batch has answered
_BUSY_POLL_INTERVAL_S = 0.5  # between checks while agents still run: the batch waits for them anyway
_SPARE_THREADS = 4  # beyond max_concurrency: the span waiter's polls, end records
_WATERMARK_MARGIN_NS = 2_000_000_000  # clock skew allowance for "spans stored since this run began"
_BSP_SCHEDULE_DELAY_MILLIS = 100  # agents export spans promptly: the trainer waits for them

ReadyFn = Callable[[Sequence[str], int], set[str]]
# on_end(ends): record_ends' shape, each end a mapping of rollout_id, reason, error, task_id, attempt, mode
EndFn = Callable[[list[dict[str, Any]]], None]


def _agent_env(environ: Mapping[str, str], otel_env: Mapping[str, str], config: RunnerConfig,
               argv: Sequence[str] | None) -> dict[str, str]:
    """A command agent's environment before the rollout's own variables: the ingest token only (issue 28),
    and a service name from its command ``argv`` unless the user named one."""
    base = {**environ, "OTEL_BSP_SCHEDULE_DELAY": str(_BSP_SCHEDULE_DELAY_MILLIS), **otel_env, **config.env,
            **kept_ingest_header(config.env, otel_env)}
    return agent_credentials({**base, **(agent_service_env(base, argv) if argv is not None else {})})


def _ray_agent(agent: Any, config: RunnerConfig, backend: RolloutsConfig, otel_env: Mapping[str, str]) -> Any:
    from spanrl.rollouts.ray_backend import node_environment, ray_agent

    argv = None if callable(agent) else (shlex.split(agent) if isinstance(agent, str) else [str(a) for a in agent])
    if argv == []:
        raise ConfigError("agent command is empty")
    node_env = _agent_env(node_environment(os.environ), otel_env, config, argv)
    return ray_agent(agent, cluster_config=backend, argv=argv, instrument=config.instrument, node_env=node_env,
                     workers=config.workers,
                     otlp_endpoint=otel_env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


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
        on_end: EndFn | None = None,
        backend: RolloutsConfig | None = None,
        api_key: str = "spanrl",
    ) -> None:
        """``ready(rollout_ids, since_ns)`` returns the ids whose spans are committed (only spans
        ingested at or after ``since_ns`` need to be looked at); ``flush`` (e.g. the policy server's
        ``force_flush``) runs before each check, after in-process spans are flushed; ``otel_env`` is the
        ``OTEL_*`` environment; ``on_end`` stores the ends the runner knows (a command agent exited, a worker
        answered, a timeout), several in one call, e.g. ``functools.partial(record_ends, store)``; ``backend``
        says where rollouts run (default: here; ``backend="ray"``: on a Ray cluster, ``ray_backend.py``)."""
        config.validate()
        backend = RolloutsConfig.of(backend)
        self.config = config
        self._ready = ready
        self._flush = flush
        self._on_end = on_end
        self._api_key = api_key  # the policy server's, handed to every rollout (OPENAI_API_KEY, llm.api_key)
        self._loop = asyncio.new_event_loop()
        # A thread for each sync agent that may run at once, and spare ones: the span waiter's store polls and
        # the end records must never queue behind agents (asyncio's default pool has cpu_count + 4 threads, so
        # 16 sync agents on 2 cores held every thread and rollouts timed out waiting for rewards already stored).
        self._loop.set_default_executor(
            ThreadPoolExecutor(max_workers=config.max_concurrency + _SPARE_THREADS, thread_name_prefix="spanrl-rollout")
        )
        if not callable(agent) and not isinstance(agent, (str, list, tuple)):
            raise ConfigError(f"agent must be a callable or a command line, got {type(agent).__name__}")
        if backend.backend == "ray":
            self._agent: Any = _ray_agent(agent, config, backend, otel_env or {})
        elif callable(agent):
            self._agent = CallableAgent(agent)
        else:
            argv = command_argv(agent, config.instrument)
            base_env = _agent_env(os.environ, otel_env or {}, config, argv)
            self._agent = WorkerPool(argv, base_env, config.workers) if config.workers else CommandAgent(argv, base_env)

    def start_agents(self) -> None:
        """Start the command workers (``workers`` > 0) now, so their start-up overlaps the caller's other
        work instead of the first rollouts; other agents start with their rollouts."""
        if isinstance(self._agent, WorkerPool):
            self._loop.run_until_complete(self._agent.start())

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
        agent_models: dict[str, str] | None = None,
    ) -> list[RolloutResult]:
        """Run every job (retrying failures); return every attempt's result, in completion order.

        Rollout ids are ``{id_prefix}{index}-a{attempt}``; each talks to ``{llm_url}/rollouts/{id}/v1``
        (``llm_url``: a server root, or a ``PolicyPool`` that leases one of its servers per rollout).
        ``prompt_template`` reaches the agent (``llm.prompt_template`` / ``SPANRL_PROMPT_TEMPLATE``);
        ``agent_models`` (agent name -> model, per-agent policies) as ``llm.agent_models`` / ``SPANRL_MODEL_<AGENT>``.
        """
        return self._loop.run_until_complete(
            self._run(
                jobs, id_prefix=id_prefix, llm_url=llm_url, model=model, sampling=sampling, mode=mode,
                on_result=on_result, prompt_template=prompt_template, agent_models=dict(agent_models or {}),
            )
        )

    def _flush_all(self) -> None:
        """In-process spans (a callable agent's, still in a batch processor), then the caller's flush."""
        if isinstance(self._agent, CallableAgent):
            from spanrl.instrumentation import flush

            flush()
        if self._flush is not None:
            self._flush()

    def _end_of(self, spec: RolloutSpec, status: str, error: str | None) -> dict[str, Any] | None:
        """The rollout's end to store when this runner is the one that knows it (see ``on_end``), else None."""
        reason = {STATUS_TIMEOUT: "timeout", STATUS_CRASHED: "crashed"}.get(status, self._agent.end_reason)
        if self._on_end is None or reason is None or (reason == "crashed" and self._agent.end_reason is None):
            return None
        return {"rollout_id": spec.rollout_id, "reason": reason, "error": error, "task_id": spec.task_id,
                "attempt": spec.attempt, "mode": spec.mode}

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
        agent_models: dict[str, str] | None = None,
    ) -> list[RolloutResult]:
        results: list[RolloutResult] = []
        slots = asyncio.Semaphore(self.config.max_concurrency)
        waiter = _SpanWaiter(self._ready, self._flush_all, since_ns=time.time_ns() - _WATERMARK_MARGIN_NS,
                             store_ends=self._on_end)
        # A str is one server's root; a PolicyPool (anything with lease()) spreads rollouts over its servers.
        lease = llm_url.lease if hasattr(llm_url, "lease") else (lambda: contextlib.nullcontext(llm_url.rstrip("/")))

        async def one(index: int, job: RolloutJob) -> None:
            for attempt in range(1, self.config.max_attempts + 1):
                rollout_id = f"{id_prefix}{index}-a{attempt}"
                seed = None if job.seed is None else derive_seed(job.seed, attempt)
                start = time.monotonic()
                async with slots:
                    with lease() as root:  # one policy server for all of this rollout's calls
                        spec = RolloutSpec(
                            rollout_id=rollout_id,
                            task_id=job.task_id,
                            task=job.task,
                            attempt=attempt,
                            mode=mode,
                            base_url=semconv.rollout_base_url(root, rollout_id, seed=seed),
                            model=model,
                            sampling=dict(sampling),
                            prompt_template=prompt_template,
                            agent_models=dict(agent_models or {}),
                            api_key=self._api_key,
                            seed=seed,
                        )
                        node = None
                        waiter.running += 1
                        try:  # a Ray agent also answers the node it ran on
                            status, error, *where = await self._agent.run(spec, self.config.rollout_timeout_s)
                            node = where[0] if where else None
                        except Exception as exc:  # e.g. the agent could not be started, or wrote garbage
                            status, error = STATUS_CRASHED, f"could not run the agent: {type(exc).__name__}: {exc}"
                        finally:
                            waiter.answered()
                end = self._end_of(spec, status, error)
                if status != STATUS_OK:
                    if end is not None:
                        await waiter.end(end)
                elif not await waiter.wait(rollout_id, self.config.span_timeout_s, end=end):
                    status, error = STATUS_NO_REWARD, (f"the agent ended without a reward: none was stored within "
                                                     f"{self.config.span_timeout_s:g} s")
                result = RolloutResult(rollout_id, job.task_id, attempt, mode, status, time.monotonic() - start, error,
                                       node)
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
    """One poller for all rollouts waiting for their spans: one store query per round, not one each; and one
    commit of the ends stored since the last round (a DuckDB commit costs ~3 ms of CPU: one per rollout was
    a tenth of the demo's rollout CPU). An end waits at most one round, which the ready check waited anyway.

    Rounds are spaced by what the batch waits for. While agents still run (``running``), the batch ends no
    sooner than they do, so a round every ``_BUSY_POLL_INTERVAL_S`` is enough; a round costs ~15 ms of the
    trainer process's CPU (the policy server's flush, the end commit, the readiness query), which every 0.1 s
    was a sixth of that process during the demo's rollouts, and that process paces them. When the last agent
    answers, or a failed rollout's end must be stored before its retry, the next round starts at once; then
    rounds come every ``_POLL_INTERVAL_S`` until every rollout is stored."""

    def __init__(self, ready: ReadyFn, flush: Callable[[], Any] | None, *, since_ns: int,
                 store_ends: EndFn | None = None) -> None:
        self._ready = ready
        self._since_ns = since_ns
        self._flush = flush
        self._store_ends = store_ends
        self._pending: dict[str, asyncio.Future[bool]] = {}
        self._ends: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._hurry = asyncio.Event()  # a round is due now, not after the pause
        self.running = 0
        """Agents of this batch that have not answered yet."""

    def answered(self) -> None:
        """An agent answered; after the last one the rollouts left are checked at once."""
        self.running -= 1
        if not self.running:
            self._hurry.set()

    async def end(self, end: dict[str, Any]) -> None:
        """Store ``end`` (``on_end``'s mapping) with the others of this round; raises what storing raised."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ends.append((end, future))
        self._wake.set()
        self._hurry.set()  # a failed rollout: its retry waits for this commit
        await future

    async def _commit_ends(self) -> None:
        batch, self._ends = self._ends, []
        if not batch:
            return
        try:
            assert self._store_ends is not None
            await asyncio.to_thread(self._store_ends, [end for end, _ in batch])
        except Exception as exc:  # each waiting rollout raises it, as its own commit would have
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            for _, future in batch:
                if not future.done():
                    future.set_result(None)

    async def wait(self, rollout_id: str, timeout_s: float, *, end: dict[str, Any] | None = None) -> bool:
        """Whether the rollout's spans are stored within ``timeout_s``. ``end`` (``on_end``'s mapping) is stored in
        the round that then checks the rollout, so a rollout waits one round, not one for its end and one more for
        its check (each step waited for its last rollout's extra round); raises what storing the end raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        self._pending[rollout_id] = future
        stored: asyncio.Future[None] | None = None
        if end is not None:
            stored = loop.create_future()
            self._ends.append((end, stored))
        self._wake.set()
        if not self.running:
            self._hurry.set()
        try:
            if stored is not None:
                await stored
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            return False
        finally:
            self._pending.pop(rollout_id, None)

    async def poll(self) -> None:
        while True:
            if not self._pending and not self._ends:
                self._wake.clear()
                await self._wake.wait()
            self._hurry.clear()  # this round serves what asked for one so far
            await self._commit_ends()
            if not self._pending:
                continue
            ids = list(self._pending)
            if self._flush is not None:
                await asyncio.to_thread(self._flush)
            done = await asyncio.to_thread(self._ready, ids, self._since_ns)
            for rollout_id in done:
                future = self._pending.get(rollout_id)
                if future is not None and not future.done():
                    future.set_result(True)
            await self._pause()

    async def _pause(self) -> None:
        """Until the next round: none when one is due now, else a short or a long pause (see the class)."""
        if self._hurry.is_set():
            return
        if not self.running:
            await asyncio.sleep(_POLL_INTERVAL_S)
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), _BUSY_POLL_INTERVAL_S)

