"""What the decoder tests need built: the C extension and, for the fuzzer, clang. In CI (`CI=true`) a
missing one is a FAILURE (a broken build must not pass as dozens of skips); elsewhere the test skips and
says why."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from spanrl.collector import fast_decode

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "in_ci", "missing", "require_clang", "require_fast_path"]


def in_ci() -> bool:
    """Whether this run is CI's (`CI` set to true / 1 / yes, as CI services and `.ci/run` set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(reason: str) -> None:
    """Fail in CI, skip elsewhere."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing build is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


def require_fast_path() -> None:
    if not fast_decode.fast_available():
        missing(f"the C extension spanrl.collector._wire is not built ({fast_decode.unavailable_reason()}); "
                f"build it with `python setup.py build_ext --inplace`")


def require_clang() -> str:
    """clang able to build a libFuzzer + ASan + UBSan binary (`make clang` installs it); its path."""
    clang = shutil.which("clang")
    if clang is None:
        missing("clang is not installed (`make clang`: apt-get install clang libclang-rt-dev)")
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run([clang, "-x", "c", "-fsanitize=fuzzer,address,undefined", "-o", str(Path(tmp) / "probe"),
                                "-"],
                               input=b"int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n",
                               capture_output=True)
    if probe.returncode:
        missing(
            "clang cannot build a sanitized libFuzzer binary (libclang-rt-dev missing?): "
            f"{probe.stderr.decode()[-400:]}"
        )
    return clang
