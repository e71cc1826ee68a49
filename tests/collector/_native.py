"""What the decoder tests need built: the C extension and, for the fuzzer, clang (missing: a failure in CI,
a skip elsewhere; tests/required.py)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from required import in_ci, missing

from spanrl.collector import fast_decode

REPO = Path(__file__).resolve().parents[2]

__all__ = ["REPO", "in_ci", "missing", "require_clang", "require_fast_path"]


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
