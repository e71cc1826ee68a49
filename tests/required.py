"""What a test needs built (a C extension, a tool): in CI (`CI=true`) a missing one is a FAILURE (a broken
build must not pass as dozens of skips); elsewhere the test skips and says why."""

from __future__ import annotations

import os

import pytest

__all__ = ["in_ci", "missing"]


def in_ci() -> bool:
    """Whether this run is CI's (`CI` set to true / 1 / yes, as CI services and `.ci/run` set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(reason: str) -> None:
    """Fail in CI, skip elsewhere."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing build is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)
