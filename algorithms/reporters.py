"""Where metrics can be reported (``report_to``): one list and one check for the algorithms and the
Trainer's config. Imports nothing heavy, so the config stays torch-free."""

from __future__ import annotations

from collections.abc import Sequence

from spanrl.errors import ConfigError

__all__ = ["REPORTERS", "check_report_to"]

REPORTERS = ("none", "tensorboard", "wandb")


def check_report_to(report_to: str | Sequence[str]) -> list[str]:
    """``report_to`` as a list without ``none``, each entry one of ``none``, ``tensorboard``, ``wandb``."""
    if isinstance(report_to, str):
        report_to = [report_to]
    for name in report_to:
        if name not in REPORTERS:
            raise ConfigError(f"report_to entries must be one of {REPORTERS}, got {name!r}")
    return [r for r in report_to if r != "none"]
