"""``pip install spanrl`` alone, as an agent's container gets it: a wheel of this checkout in a fresh venv
(no system site-packages, dependencies from the package index), once per session. The agent side works
there (a reward span reaches a real collector run from the test's own venv); nothing of the collector's,
the store's or training's dependencies is installed; a command that needs an extra says which one.

Cost: one venv, one isolated wheel build, one install from the index: ~30 s on a quiet machine, ~2 min on
two loaded cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from wheel_sources import copy_wheel_sources

pytestmark = pytest.mark.slow  # one venv and an install from the package index per session

REPO = Path(__file__).resolve().parents[2]
_NOT_IN_BASE = ("duckdb", "pyarrow", "numpy", "uvicorn", "torch", "transformers", "orjson", "fastapi")
_INSTALL_TIMEOUT_S = 600
_RUN_TIMEOUT_S = 120

_AGENT = """
import sys
import spanrl
spanrl.emit_reward(0.75, name="base-install")
heavy = sorted(m for m in ("duckdb", "pyarrow", "numpy", "uvicorn", "torch") if m in sys.modules)
print("loaded:", heavy)
"""


def _pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args],
                          capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=True)


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("base-install")
    source = copy_wheel_sources(tmp / "source")  # setup.py (the C extension) is not among them
    venv = tmp / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True, timeout=_INSTALL_TIMEOUT_S)
    # an isolated build: setuptools from the index, not whatever the test's venv has
    _pip(venv, "wheel", "-q", "--no-deps", "-w", str(tmp / "wheels"), str(source))
    (wheel,) = (tmp / "wheels").glob("spanrl-*.whl")
    _pip(venv, "install", "-q", str(wheel))
    return venv


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "SPANRL_", "TRACELOOP_", "OPENAI_", "PYTHON", "VIRTUAL_ENV"))}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def test_base_install_has_no_collector_store_or_training_dependencies(base_venv: Path) -> None:
    listed = {line.split()[0].lower() for line in _pip(base_venv, "list").stdout.splitlines()[2:]}
    assert "spanrl" in listed
    assert "opentelemetry-sdk" in listed and "opentelemetry-instrumentation-openai" in listed
    assert sorted(listed & set(_NOT_IN_BASE)) == []


def test_agent_in_base_install_emits_a_reward_the_collector_stores(base_venv: Path, collector_proc: Any,
                                                                     tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(_AGENT)
    env = _clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{collector_proc.grpc_endpoint}", OTEL_SERVICE_NAME="base",
                     SPANRL_ROLLOUT_ID="r-base", SPANRL_TASK_ID="t-1", SPANRL_ATTEMPT="1")
    out = subprocess.run([str(base_venv / "bin" / "opentelemetry-instrument"), str(base_venv / "bin" / "python"),
                          str(agent)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=_RUN_TIMEOUT_S)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "loaded: []"
    assert out.stderr == "", out.stderr  # nothing on the agent's terminal
    rows = collector_proc.sql("SELECT rollout_id, task_id, reward_name, reward_value, service_name FROM spans "
                              "WHERE reward_value IS NOT NULL")
    assert rows == [{"rollout_id": "r-base", "task_id": "t-1", "reward_name": "base-install", "reward_value": 0.75,
                     "service_name": "base"}]


@pytest.mark.parametrize("command", [["collector", "--db", "spans.duckdb"], ["sql", "SELECT 1"],
                                     ["train", "config.yaml"], ["serve", "--model", "m"]])
def test_command_without_its_extra_says_which_to_install(base_venv: Path, tmp_path: Path,
                                                         command: list[str]) -> None:
    extra = {"collector": "collector", "sql": "collector", "train": "train", "serve": "serve"}[command[0]]
    out = subprocess.run([str(base_venv / "bin" / "spanrl"), *command], cwd=tmp_path, env=_clean_env(),
                         capture_output=True, text=True, timeout=_RUN_TIMEOUT_S)
    assert out.returncode == 2  # a missing extra is bad input (MissingExtraError is a ConfigError)
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"spanrl: error: spanrl {command[0]} needs the {extra} extra: "
                               f"pip install 'spanrl[{extra}]' (missing: "), lines[0]
    assert not list(tmp_path.iterdir())  # it stopped before doing anything


def test_help_names_the_extra_and_the_cli_lists_every_command(base_venv: Path, tmp_path: Path) -> None:
    spanrl = str(base_venv / "bin" / "spanrl")
    listing = subprocess.run([spanrl, "--help"], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True,
                             timeout=_RUN_TIMEOUT_S, check=True).stdout
    for command in ("collector", "sql", "store", "serve", "train", "demo", "export", "ui"):
        assert command in listing
    helped = subprocess.run([spanrl, "collector", "--help"], cwd=tmp_path, env=_clean_env(), capture_output=True,
                            text=True, timeout=_RUN_TIMEOUT_S, check=True).stdout
    assert "needs the collector extra (not installed here): pip install 'spanrl[collector]'" in " ".join(helped.split())
