"""A Python callable agent ``agent(task, llm)`` (sync or async), one rollout at a time inside a
``spanrl.rollout`` context; a returned number is emitted as the reward. Run by ``runner.RolloutRunner`` in
the Trainer's process, or by ``ray_task.run_callable`` on a Ray node."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from spanrl.rollouts.rollouts import STATUS_CRASHED, STATUS_OK, STATUS_TIMEOUT, AgentFn, LLMEndpoint, RolloutSpec

__all__ = ["CallableAgent"]


class CallableAgent:
    """One rollout of ``agent(task, llm)`` in this process, inside its ``spanrl.rollout`` context."""

    end_reason: str | None = None  # its spanrl.rollout span is its end

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
            base_url=spec.base_url, model=spec.model, sampling=dict(spec.sampling),
            prompt_template=spec.prompt_template, agent_models=dict(spec.agent_models), api_key=spec.api_key,
            seed=spec.seed,
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
