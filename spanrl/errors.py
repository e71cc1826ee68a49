"""The public exceptions of spanrl, one shallow tree::

    SpanRLError
    ├── ConfigError          a bad argument, config field or environment value
    │   ├── MissingExtraError  a command needs an extra that is not installed (pip install 'spanrl[EXTRA]')
    │   └── UsageError       a file or folder a command cannot read as what it asked for (exit status 2)
    ├── StoreError           the DuckDB span store cannot do what was asked
    │   ├── StoreBusyError   another process holds the database file (and no collector serves SQL)
    │   └── StoreUnavailableError  no collector answers, or it answered 503: try again later
    ├── CollectorError       the collector could not start or was refused
    ├── ServingError         the policy server cannot load or serve a model
    └── TrainingError        the training loop cannot go on

Collector-internal errors keep the OTLP split between *retryable* (UNAVAILABLE / 503) and *permanent*
(INVALID_ARGUMENT / 400) in `spanrl.collector.errors`.
"""

from __future__ import annotations

__all__ = [
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
]


class SpanRLError(Exception):
    """Base class of every error spanrl raises on purpose."""

    exit_code = 1
    """The ``spanrl`` command's exit status when this error ends it (one line, no traceback)."""


class ConfigError(SpanRLError, ValueError):
    """A bad argument, config field or environment value; the message names the field."""


class MissingExtraError(ConfigError):
    """A command or name needs an optional extra that is not installed; ``extra`` names it
    (``pip install 'spanrl[<extra>]'``). An input error: retrying without installing it cannot help."""

    def __init__(self, message: str, *, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


class UsageError(ConfigError):
    """A command was given a file or folder it cannot read as what it asked for: a config that is not valid
    YAML, a tasks file of another format, a folder that is neither a model nor a run. Exit status 2, as for
    a bad command line."""

    exit_code = 2


class StoreError(SpanRLError):
    """The span store cannot do what was asked."""


class StoreBusyError(StoreError):
    """Another process holds the DuckDB file and no collector answers SQL for it."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached right now: no collector answers at its URL, or it answered 503 (its
    store is reopening after a failure). Retrying later may help; any other `StoreError` will not."""


class CollectorError(SpanRLError):
    """The collector could not start, or refused a request."""


class ServingError(SpanRLError):
    """The policy server cannot load or serve a model."""


class TrainingError(SpanRLError):
    """The training loop cannot go on."""
