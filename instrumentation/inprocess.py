"""The public face of what an in-process tracer (the Trainer's tracing of callable agents) needs from
the agent-side package: the processor that puts rollout ids on spans, and a complete OpenAI
uninstrument. Both need the OTel SDK, so ``import spanrl.instrumentation`` does not load them."""

from __future__ import annotations

from spanrl.instrumentation._openllmetry import uninstrument_openai
from spanrl.instrumentation._processor import RolloutSpanProcessor, attach_rollout_processor

__all__ = ["RolloutSpanProcessor", "attach_rollout_processor", "uninstrument_openai"]
