"""spanrl: train any AI agent's LLM with reinforcement learning from its OpenTelemetry traces.

The agent side (``emit_reward``, ``agent``, ``rollout``, ...) imports no torch. Training and serving
names (``Trainer``, ``GRPO``, ``PolicyServer``, ...) are loaded on first use and need the
``spanrl[train]`` / ``spanrl[serve]`` extras (``Collector``, ``SpanStore``: ``spanrl[collector]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spanrl._lazy import lazy_getattr
from spanrl.errors import (
    CollectorError,
    ConfigError,
    MissingExtraError,
    ServingError,
    SpanRLError,
    StoreBusyError,
    StoreError,
    StoreUnavailableError,
    TrainingError,
    UsageError,
)

__version__ = "0.1.0"

# public name -> module that defines it; loaded lazily so `import spanrl` stays light.
_LAZY: dict[str, str] = {
    "emit_reward": "spanrl.instrumentation",
    "emit_feedback": "spanrl.instrumentation",
    "emit_observation": "spanrl.instrumentation",
    "emit_tool_call": "spanrl.instrumentation",
    "emit_prompt": "spanrl.instrumentation",
    "emit_response": "spanrl.instrumentation",
    "agent": "spanrl.instrumentation",
    "rollout": "spanrl.instrumentation",
    "Collector": "spanrl.collector",
    "SpanStore": "spanrl.store",
    "PolicyServer": "spanrl.serving",
    "Trainer": "spanrl.trainer",
    "GRPO": "spanrl.algorithms",
    "PPO": "spanrl.algorithms",
    "SFT": "spanrl.algorithms",
    "DPO": "spanrl.algorithms",
    "APO": "spanrl.algorithms",
    "LightningRL": "spanrl.algorithms",
}

__all__ = sorted(
    [
        "CollectorError",
        "ConfigError",
        "MissingExtraError",
        "ServingError",
        "SpanRLError",
        "StoreBusyError",
        "StoreError",
        "StoreUnavailableError",
        "TrainingError",
        "UsageError",
        "__version__",
        *_LAZY,
    ]
)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from spanrl.algorithms import APO, DPO, GRPO, PPO, SFT, LightningRL
    from spanrl.collector import Collector
    from spanrl.instrumentation import (
        agent,
        emit_feedback,
        emit_observation,
        emit_prompt,
        emit_response,
        emit_reward,
        emit_tool_call,
        rollout,
    )
    from spanrl.serving import PolicyServer
    from spanrl.store import SpanStore
    from spanrl.trainer import Trainer
