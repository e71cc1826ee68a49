"""spanrl.rollouts: running agents until their spans are stored.

What a rollout is (:mod:`~spanrl.rollouts.rollouts`), the runner that runs them bounded and concurrent
(:mod:`~spanrl.rollouts.runner`), command-line agents as processes or long-lived workers
(:mod:`~spanrl.rollouts.agent_processes`, their environment in :mod:`~spanrl.rollouts.agent_env`),
tracing of in-process agents (:mod:`~spanrl.rollouts.tracing`), the policy servers rollouts are sent to
(:mod:`~spanrl.rollouts.policy_pool`) and later steps' rollouts run ahead while an update computes
(:mod:`~spanrl.rollouts.prefetch`). The Trainer (:mod:`spanrl.trainer`) drives them; public names load
on first use.
"""

from __future__ import annotations

from spanrl._lazy import lazy_getattr

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "CommandAgent": "spanrl.rollouts.agent_processes",
    "InProcessTracing": "spanrl.rollouts.tracing",
    "LLMEndpoint": "spanrl.rollouts.rollouts",
    "PolicyPool": "spanrl.rollouts.policy_pool",
    "RolloutResult": "spanrl.rollouts.rollouts",
    "RolloutRunner": "spanrl.rollouts.runner",
    "RolloutSpec": "spanrl.rollouts.rollouts",
    "RolloutsConfig": "spanrl.rollouts.rollouts",
    "RunnerConfig": "spanrl.rollouts.rollouts",
    "ServingConfig": "spanrl.rollouts.policy_pool",
    "WorkerPool": "spanrl.rollouts.agent_processes",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
