"""spanrl.trainer: the loop around the algorithms.

The ``Trainer`` (collect rollouts, load transitions, update, reload, report), the rollout runner,
tracing of in-process agents, reporting callbacks, plots, the quick-start API, curriculum, the demo
and the tiny-model builder. Public names are loaded on first use, so importing one part does not
import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "LLMEndpoint": "spanrl.trainer.runner",
    "OnlineConfig": "spanrl.trainer.online",
    "OnlineTrainer": "spanrl.trainer.online",
    "RunnerConfig": "spanrl.trainer.runner",
    "Trainer": "spanrl.trainer.trainer",
    "TrainerConfig": "spanrl.trainer.trainer",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spanrl.trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
