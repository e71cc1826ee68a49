"""The lean capture profile's context propagation: W3C ``traceparent`` and ``baggage`` on every request
of the ``openai`` client, with no OpenAI instrumentor loaded.

Under ``SPANRL_CAPTURE=lean`` the agent records no LLM span of its own (the policy server records each
call with its exact token ids); what training still needs from the agent is that each request names its
trace and rollout, so the server's span joins the agent's tool and reward spans. ``patch()`` wraps the
client's header builder (``openai._base_client.BaseClient._build_headers``, shared by the sync and async
clients) to inject the current context with the global propagator; ``unpatch()`` restores it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from opentelemetry import propagate

__all__ = ["patch", "unpatch", "with_context_headers"]

_logger = logging.getLogger(__name__)
_ORIGINAL = "_spanrl_original"


def with_context_headers(build_headers: Callable[..., Any]) -> Callable[..., Any]:
    """``build_headers`` (a client's ``_build_headers``) that also injects the current trace context."""

    def _build_headers(self: Any, *args: Any, **kwargs: Any) -> Any:
        headers = build_headers(self, *args, **kwargs)
        try:
            propagate.inject(headers)
        except Exception:  # telemetry never breaks the agent's request
            _logger.debug("spanrl could not add trace context headers", exc_info=True)
        return headers

    setattr(_build_headers, _ORIGINAL, build_headers)
    return _build_headers


def patch() -> bool:
    """Inject trace context into every ``openai`` request; False where ``openai`` is not installed."""
    try:
        from openai._base_client import BaseClient
    except ImportError:
        return False
    if getattr(BaseClient._build_headers, _ORIGINAL, None) is None:
        BaseClient._build_headers = with_context_headers(BaseClient._build_headers)  # type: ignore[method-assign]
    return True


def unpatch() -> None:
    try:
        from openai._base_client import BaseClient
    except ImportError:
        return
    original = getattr(BaseClient._build_headers, _ORIGINAL, None)
    if original is not None:
        BaseClient._build_headers = original  # type: ignore[method-assign]
