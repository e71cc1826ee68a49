"""What the Trainer reports per step besides ``history.jsonl``: TensorBoard / W&B scalars, and the
stand-in for rich progress bars when they are off."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError

__all__ = ["NoProgress", "Reporter"]


class Reporter:
    """TensorBoard / W&B scalars, one call per step."""

    def __init__(self, report_to: Sequence[str], log_dir: Path, config: Mapping[str, Any]) -> None:
        self._tb: Any = None
        self._wandb: Any = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(log_dir))
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError:
                raise ConfigError("report_to='wandb' needs the wandb package: pip install wandb") from None
            self._wandb = wandb.init(project="spanrl", config=dict(config), dir=str(log_dir))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(dict(scalars), step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


class NoProgress:
    """The progress context when progress bars are off: ``with NoProgress() as progress`` gives None."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        pass
