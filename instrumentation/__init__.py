"""spanrl.instrumentation: the agent side. Imports no torch and nothing from the trainer.

* ``emit_reward``, ``emit_observation``, ``emit_tool_call``, ``emit_prompt`` / ``emit_response``,
  ``agent``: spans in the spanrl vocabulary (``docs/conventions.md``); no-ops without an SDK, never raise.
* ``emit_feedback``: a late reward for a finished rollout, from any process (``feedback.py``).
* ``rollout``: run code as one rollout (root span + ids in baggage).
* ``configure`` / ``flush``: set up the OTel SDK programmatically (without ``opentelemetry-instrument``).
* Entry points for ``opentelemetry-instrument``: ``distro.SpanRLDistro``,
  ``configurator.SpanRLConfigurator``, ``instrumentor.SpanRLInstrumentor``.
"""

from __future__ import annotations

from spanrl.instrumentation._emit import agent, emit_observation, emit_reward, emit_tool_call
from spanrl.instrumentation._llm_calls import LLMCall, emit_prompt, emit_response
from spanrl.instrumentation.feedback import emit_feedback
from spanrl.instrumentation._rollout import current_rollout, rollout, rollout_resource_attributes
from spanrl.instrumentation._setup import configure, flush
from spanrl.instrumentation.config import InstrumentationConfig, default_config

__all__ = [
    "InstrumentationConfig",
    "LLMCall",
    "agent",
    "configure",
    "current_rollout",
    "default_config",
    "emit_feedback",
    "emit_observation",
    "emit_prompt",
    "emit_response",
    "emit_reward",
    "emit_tool_call",
    "flush",
    "rollout",
    "rollout_resource_attributes",
]

