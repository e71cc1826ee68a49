"""A long example prints for people, through the console ``spanrl train`` uses: ``examples/quickstart/arith.py``
run as a user runs it (a subprocess, two GRPO steps on the tiny model) shows where its logs are, one line
per step and its summary; library messages, warnings and third-party bars are in the log file instead."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_NOISE = ("Warning", "warnings.warn", "Loading weights", "Writing model shards", "it/s]", "s/it]", "%|", "{'", "INFO",
          "Traceback")


@pytest.mark.slow
def test_quickstart_example_prints_a_line_per_step_and_logs_to_a_file(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "quickstart" / "arith.py"), "--out", "run", "--steps", "2"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600,
    )
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown[-4000:]
    lines = shown.splitlines()
    assert lines[0] == "full logs: run/spanrl.log", shown
    assert lines[1] == "spanrl: seed 0", shown  # every run says its seed at start (issue 55)
    assert re.fullmatch(r"step 0/2  held-out \d\.\d\d", lines[2]), shown
    assert re.fullmatch(r"step 1/2  reward \d\.\d\d  kl \d\.\d{4}  rollouts 32  \d+\.\d s", lines[3]), shown
    assert re.fullmatch(r"step 2/2  reward \d\.\d\d  held-out \d\.\d\d  kl \d\.\d{4}  rollouts 32  \d+\.\d s",
                        lines[4]), shown
    assert lines[5].startswith("reward by step: [") and lines[6].startswith("add 3 4 -> ") and len(lines) == 7, shown
    for noise in _NOISE:
        assert noise not in shown, f"{noise!r} reached the terminal:\n{shown}"
    log = (tmp_path / "run" / "spanrl.log").read_text()
    assert "step 1: {" in log and "step 2: {" in log  # the whole rows went to the file
