"""Run a bench's script in a process of its own that imports the spanrl it is meant to measure.

``python -c`` puts the current directory first on ``sys.path``: run from a checkout, its ``spanrl/``
folder shadows the spanrl that ``PYTHONPATH`` names (before 2026-12-06 the tracer benches' comparisons with
another version measured the checkout twice that way). The script runs in an empty directory, and the
caller checks which files it imported (the script reports ``spanrl.instrumentation._emit.__file__``).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

def run_script(script: str, args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -c script args`` in an empty directory, output captured."""
    with tempfile.TemporaryDirectory(prefix="spanrl-bench-") as empty:
        return subprocess.run([sys.executable, "-c", script, *args], cwd=empty, env=env, capture_output=True,
                              text=True, timeout=timeout)


def check_imported(imported: str, root: str | Path, version: str) -> None:
    """Stop the bench if ``version``'s process imported spanrl's agent side from anywhere but ``root``."""
    if not Path(imported).resolve().is_relative_to(Path(root).resolve()):
        raise RuntimeError(f"the {version} process imported {imported}, not the spanrl in {root}")
