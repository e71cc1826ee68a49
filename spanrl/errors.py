"""The public exceptions of spanrl, one shallow tree::

    SpanRLError
    ├── ConfigError          a bad argument, config field or environment value (exit status 2: bad input)
    │   ├── MissingExtraError  a command needs an extra that is not installed (pip install 'spanrl[EXTRA]')
    │   └── UsageError       a file or folder a command cannot read as what it asked for
    ├── StoreError           the DuckDB span store cannot do what was asked
    │   ├── StoreBusyError   another process holds the database file (and no collector serves SQL)
    │   └── StoreUnavailableError  no collector answers, or it answered 503: try again later
    ├── CollectorError       the collector could not start or was refused
    ├── ServingError         the policy server cannot load or serve a model
    └── TrainingError        the training loop cannot go on

Collector-internal errors keep the OTLP split between *retryable* (UNAVAILABLE / 503) and *permanent*
(INVALID_ARGUMENT / 400) in `spanrl.collector.errors`.

A ``spanrl`` command ends on an error in one way, `cli_error`: one line on stderr, ``spanrl: error: MESSAGE``, no
traceback, and the exit status of its kind: 2 for bad input (as argparse's own usage errors), 1 for a run that
could not do what was asked.
"""

from __future__ import annotations

import sys
from typing import Iterable

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
    "cli_error",
    "one_of",
]

USAGE_EXIT_CODE = 2
"""A ``spanrl`` command's exit status for bad input: a bad flag, config field, file or environment value."""


class SpanRLError(Exception):
    """Base class of every error spanrl raises on purpose."""

    exit_code = 1
    """The ``spanrl`` command's exit status when this error ends it (one line, no traceback)."""


class ConfigError(SpanRLError, ValueError):
    """A bad argument, config field or environment value; the message names the field."""

    exit_code = USAGE_EXIT_CODE


class MissingExtraError(ConfigError):
    """A command or name needs an optional extra that is not installed; ``extra`` names it
    (``pip install 'spanrl[<extra>]'``). An input error: retrying without installing it cannot help."""

    def __init__(self, message: str, *, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


class UsageError(ConfigError):
    """A command was given a file or folder it cannot read as what it asked for: a config that is not valid
    YAML, a tasks file of another format, a folder that is neither a model nor a run."""


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


def one_of(field: str, value: object, allowed: Iterable[object]) -> None:
    """The check of a setting against its allowed values, worded one way: `ConfigError` ``FIELD must be one of A,
    B; got 'x'`` (the field, the allowed values, the bad value) unless ``value`` is among ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(f"{field} must be one of {', '.join(map(str, allowed))}; got {value!r}")


def positive_int(field: str, value: object, *, optional: bool = False) -> None:
    """The check of a count setting, worded one way: `ConfigError` ``FIELD must be a positive integer[ or None],
    got X`` unless ``value`` is an int (a bool is not one) >= 1, or None where ``optional``."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{field} must be a positive integer{' or None' if optional else ''}, got {value!r}")


def non_negative_int(field: str, value: object) -> None:
    """The check of a count setting that may be 0 (0 turns it off), worded one way: `ConfigError` ``FIELD must be a
    non-negative integer, got X`` unless ``value`` is an int (a bool is not one) >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{field} must be a non-negative integer, got {value!r}")


def positive_number(field: str, value: object, *, optional: bool = False, allow_zero: bool = False) -> None:
    """The check of a rate, weight or timeout setting, worded one way: `ConfigError` ``FIELD must be > 0[ or None],
    got X`` (``>= 0`` where ``allow_zero``) unless ``value`` is an int or float (a bool is not one) above 0 (or 0
    where ``allow_zero``), or None where ``optional``. NaN is refused: it is not above 0."""
    if optional and value is None:
        return
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not (value >= 0 if allow_zero else value > 0)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{field} must be {bound}{' or None' if optional else ''}, got {value!r}")


def cli_error(problem: BaseException | str, exit_code: int | None = None) -> int:
    """End a ``spanrl`` command on ``problem``: print ``spanrl: error: PROBLEM`` (one line, no traceback) to stderr
    and return the exit status: ``exit_code`` when given, else the error's own (`SpanRLError.exit_code`), else
    `USAGE_EXIT_CODE` for a message (a command's own check of its input)."""
    if exit_code is None:
        exit_code = getattr(problem, "exit_code", 1) if isinstance(problem, BaseException) else USAGE_EXIT_CODE
    print(f"spanrl: error: {problem}", file=sys.stderr, flush=True)
    return exit_code
