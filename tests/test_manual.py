"""The docs every help text points at ship with spanrl (pyproject's package data) and ``spanrl docs`` prints them;
the README and the help texts say the same thing once: one torch command, the demo's minutes, held-out success
defined where it is printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def _spanrl(*args: str) -> subprocess.CompletedProcess[str]:
    wide = {**os.environ, "COLUMNS": "1000"}  # argparse wraps help at hyphens otherwise
    return subprocess.run([sys.executable, "-m", "spanrl", *args], capture_output=True, text=True, timeout=120,
                          env=wide)


def test_the_docs_ship_in_the_wheel_and_spanrl_docs_prints_them() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "spanrl.docs" in setuptools["packages"] and setuptools["package-dir"]["spanrl.docs"] == "docs"
    assert setuptools["package-data"]["spanrl.docs"] == ["*.md"]
    listed = _spanrl("docs")
    assert listed.returncode == 0
    assert re.search(r"^train-config +The `spanrl train` config  \(.*train-config\.md\)$", listed.stdout, re.M)
    shown = _spanrl("docs", "online-config")
    assert shown.returncode == 0 and shown.stdout == (REPO / "docs" / "online-config.md").read_text()
    missing = _spanrl("docs", "trian-config")
    assert missing.returncode == 2 and missing.stderr.startswith("spanrl: error: docs: no doc 'trian-config'; the "
                                                                 "docs are architecture, cluster, conventions,")
    helped = _spanrl("train", "--help").stdout
    for named in set(re.findall(r"docs/([\w-]+)\.md", " ".join(helped.split()))):  # each doc the help names ships
        assert (REPO / "docs" / f"{named}.md").is_file(), named
    assert "spanrl docs train-config" in " ".join(helped.split())


def test_one_torch_command_and_the_demos_minutes_in_one_voice() -> None:
    torch = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    commands = set(re.findall(r"pip install torch==[^`\n]*", README))
    assert commands == {torch, "pip install torch==2.13.0 $TORCH_PIP_ARGS"}, commands  # the second: make's own
    assert torch in (REPO / "pyproject.toml").read_text()
    demo_help = " ".join(_spanrl("demo", "--help").stdout.split())
    assert "10.6 minutes on two quiet cores" in demo_help and "10.6 minutes on two quiet cores" in README
    assert "a few minutes on two cores" in demo_help and "a few minutes on two CPU cores" in README


def test_held_out_success_is_defined_where_it_is_printed() -> None:
    definition = "one greedy rollout per val_tasks task, the mean final reward, a failed rollout counting 0"
    assert definition in " ".join(_spanrl("train", "--help").stdout.split())
    assert "*held-out\nsuccess*: one greedy (temperature 0) rollout per held-out task" in README
    assert '`"id":"policy"`' in README  # as the server prints it
