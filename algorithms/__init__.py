"""spanrl.algorithms: credit assignment, the training algorithms on TRL, the Trainer loop.

Public names are loaded on first use, so importing one part does not import them all.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "APO": "spanrl.algorithms.apo",
    "APOConfig": "spanrl.algorithms.apo",
    "APOResult": "spanrl.algorithms.apo",
    "Algorithm": "spanrl.algorithms.base",
    "DPO": "spanrl.algorithms.dpo",
    "DPOConfig": "spanrl.algorithms.dpo",
    "GRPO": "spanrl.algorithms.grpo",
    "GRPOConfig": "spanrl.algorithms.grpo",
    "LLMEndpoint": "spanrl.algorithms.runner",
    "LightningRL": "spanrl.algorithms.trainer",
    "LoRAConfig": "spanrl.algorithms.lora",
    "PPO": "spanrl.algorithms.ppo",
    "PPOConfig": "spanrl.algorithms.ppo",
    "SFT": "spanrl.algorithms.sft",
    "SFTConfig": "spanrl.algorithms.sft",
    "RunnerConfig": "spanrl.algorithms.runner",
    "Trainer": "spanrl.algorithms.trainer",
    "TrainerConfig": "spanrl.algorithms.trainer",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'spanrl.algorithms' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
