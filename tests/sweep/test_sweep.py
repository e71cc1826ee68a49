"""``spanrl sweep``: a 4-trial grid (learning rate x group size) on the calculator example at a quick
setting, each trial a real Trainer run under Ray Tune in its own folder; the table and the best config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray", reason="Ray is not installed: pip install 'spanrl[ray]'")

from spanrl.errors import ConfigError  # noqa: E402
from spanrl.sweep.search import SweepConfig, apply  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_ray_at_a_time")  # tests/conftest.py


def test_dotted_keys_set_nested_train_config_values() -> None:
    raw = {"algorithm": {"name": "grpo", "learning_rate": 1.0}, "n_rollouts": 2}
    out = apply(raw, {"algorithm.learning_rate": 0.5, "credit.mode": "identical", "n_rollouts": 4})
    assert out == {"algorithm": {"name": "grpo", "learning_rate": 0.5}, "credit": {"mode": "identical"},
                   "n_rollouts": 4}
    assert raw["algorithm"]["learning_rate"] == 1.0  # the base is left as it was


def test_bad_sweep_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"train": {}, "parameters": {"n_rollouts": []}}))
    with pytest.raises(ConfigError, match="sweep.parameters.n_rollouts must be a non-empty list"):
        SweepConfig.load(path)
    path.write_text(yaml.safe_dump({"train": {}, "parameters": {"n_rollouts": [2]}, "serach": "grid"}))
    with pytest.raises(ConfigError, match="did you mean 'search'"):
        SweepConfig.load(path)


def test_a_four_trial_grid_trains_each_and_prints_the_best(tmp_path: Path) -> None:
    """What a user runs and sees: ``spanrl sweep`` in its own process (it starts and stops its own Ray),
    one line per trial and the best; each trial a whole Trainer run in its own folder."""
    base = yaml.safe_load((REPO / "examples" / "calculator" / "train.yaml").read_text())
    base.update(max_steps=1, tasks_per_step=2, eval_every=1, torch_threads=1, runner={"workers": 2,
                "max_concurrency": 4}, val_tasks=[json.loads(line) for line in
                (REPO / "examples" / "calculator" / "val.jsonl").read_text().splitlines()[:2]])
    base["tasks"] = str(REPO / "examples" / "calculator" / "tasks.jsonl")
    base["agent"] = [sys.executable, str(REPO / "examples" / "calculator" / "agent.py")]
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(base))
    sweep = {"train": "train.yaml", "search": "grid", "output_dir": str(tmp_path / "sweep"),
             "parameters": {"algorithm.learning_rate": [1.0e-4, 1.0e-3], "n_rollouts": [2, 4]},
             "resources_per_trial": {"CPU": 0.5}, "max_concurrent_trials": 4}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    spanrl = Path(sys.executable).with_name("spanrl")
    done = subprocess.run([str(spanrl), "sweep", str(tmp_path / "sweep.yaml")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # Ray's and Tune's messages are in the log file, not on screen
    lines = done.stdout.splitlines()
    assert lines[0] == f"full logs: {tmp_path / 'sweep' / 'spanrl.log'}" and len(lines) == 6, lines
    trials = lines[1:5]
    assert all(line.startswith("trial") and "val_success" in line and "failed" not in line for line in trials), lines
    combos = {(lr, n) for lr in ("0.0001", "0.001") for n in (2, 4)}
    assert {(line.split("algorithm.learning_rate=")[1].split()[0], int(line.split("n_rollouts=")[1].split()[0]))
            for line in trials} == combos
    assert lines[-1].startswith("best: {")
    folders = [Path(line.split()[-1]) for line in trials]
    for folder in folders:  # each trial is a whole Trainer run in its own output folder
        history = [json.loads(row) for row in (folder / "history.jsonl").read_text().splitlines()]
        assert history[-1]["step"] == 1 and history[-1].get("val_success") is not None
        assert folder.parent == tmp_path / "sweep"
    assert len(set(folders)) == 4
