"""LoRA through PEFT (Hu et al. 2021, arXiv 2106.09685): one small config every algorithm accepts.

One adapter per agent of a multi-agent system, trained together on one base: ``Trainer(policies=...)``
(``spanrl.algorithms.policies``). With one algorithm's ``lora``, each checkpoint holds the merged weights (for
serving) plus the adapter alone in ``adapters/<adapter_name>/``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spanrl.errors import ConfigError, positive_int, positive_number

__all__ = ["LoRAConfig"]


@dataclasses.dataclass
class LoRAConfig:
    """A LoRA adapter: rank, scaling, dropout, target modules."""

    r: int = 8
    """Rank of the update matrices."""
    alpha: int = 16
    """Scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: tuple[str, ...] | str = "all-linear"
    """Module names to adapt, or ``all-linear`` (PEFT's shorthand)."""
    adapter_name: str = "default"
    """Name of the adapter (e.g. the agent it trains)."""

    def validate(self) -> LoRAConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        positive_int("lora.r", self.r)
        positive_number("lora.alpha", self.alpha)
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules:
            raise ConfigError("lora.target_modules must name at least one module or be 'all-linear'")
        if not self.adapter_name or not self.adapter_name.replace("-", "_").isidentifier():
            raise ConfigError(f"lora.adapter_name must be an identifier-like name, got {self.adapter_name!r}")
        return self

    def to_peft(self) -> Any:
        """The equivalent ``peft.LoraConfig`` (task type causal LM)."""
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets, task_type="CAUSAL_LM"
        )
