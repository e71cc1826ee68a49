"""A run folder is never silently reused: ``spanrl train`` (and a ``Trainer``, and ``spanrl demo``) into a folder
holding an earlier run refuses in one line naming --resume, --overwrite and another folder; ``--overwrite``
removes the earlier run (its tiny model included, rebuilt from the new tasks' words) before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spanrl.errors import ConfigError
from spanrl.trainer.train_config import build_trainer


def _earlier_run(run: Path) -> None:
    """What a finished run leaves: its config, history, span store, a checkpoint and the tiny model it built."""
    from spanrl.demo.tiny import build_tiny_model

    build_tiny_model(run / "model", words=["old", "words"], hidden_size=16, num_layers=1, num_heads=2,
                     intermediate_size=32)
    (run / "checkpoint-3").mkdir()
    (run / "checkpoint-3" / "trainer_state.json").write_text('{"step": 3, "history": []}')
    for name in ("config.json", "history.jsonl", "spans.duckdb"):
        (run / name).write_text("{}\n")


def _config(tmp_path: Path, **extra: object) -> dict:
    return {"model": {"tiny": {"words_from_tasks": True, "hidden_size": 16, "num_layers": 1, "num_heads": 2,
                               "intermediate_size": 32}},
            "agent": [sys.executable, "agent.py"], "tasks": [{"id": "a", "question": "fresh tasks"}],
            "tasks_per_step": 1, "output_dir": str(tmp_path / "run"), **extra}


def test_spanrl_train_into_an_earlier_run_names_the_choices(tmp_path: Path) -> None:
    _earlier_run(tmp_path / "run")
    (tmp_path / "train.yaml").write_text(json.dumps(_config(tmp_path)))
    done = subprocess.run([sys.executable, "-m", "spanrl", "train", str(tmp_path / "train.yaml")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr  # bad input: exit status 2
    assert done.stderr.strip().splitlines() == [
        f"spanrl: error: output_dir: {tmp_path / 'run'} holds an earlier run (config.json, history.jsonl, "
        "spans.duckdb, checkpoint-3): continue it with --resume (resume: true), start over with --overwrite "
        "(overwrite: true; removes that run), or choose another --output-dir"]
    assert (tmp_path / "run" / "checkpoint-3").is_dir()  # nothing was touched


def test_overwrite_removes_the_earlier_run_and_rebuilds_the_tiny_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _earlier_run(run)
    (run / "notes.txt").write_text("mine")  # not a run's file: kept
    trainer = build_trainer(_config(tmp_path, overwrite=True), base=tmp_path)
    assert sorted(p.name for p in run.iterdir()) == ["model", "notes.txt"]
    vocabulary = json.loads((run / "model" / "tokenizer.json").read_text())["model"]["vocab"]
    assert "fresh" in vocabulary and "old" not in vocabulary  # built from the new tasks' words
    assert trainer.config.overwrite is True
    with pytest.raises(ConfigError, match="resume and overwrite are both set"):
        build_trainer(_config(tmp_path, overwrite=True, resume=True), base=tmp_path)
    build_trainer(_config(tmp_path, resume=True), base=tmp_path)  # resuming an earlier run is no reuse by mistake


def test_trainer_refuses_an_earlier_run_before_starting_anything(tmp_path: Path) -> None:
    from spanrl.algorithms import GRPO
    from spanrl.trainer import Trainer

    _earlier_run(tmp_path / "run")
    trainer = Trainer(model=tmp_path / "run" / "model", agent=[sys.executable, "agent.py"], tasks=[{"id": "a"}],
                      algorithm=GRPO(), tasks_per_step=1, output_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match="holds an earlier run .*: continue it with --resume"):
        trainer.start()
    assert trainer.collector is None and trainer.server is None
    assert (tmp_path / "run" / "config.json").read_text() == "{}\n"  # not rewritten


def test_demo_into_an_earlier_demo_offers_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    (out / "sft").mkdir(parents=True)
    (out / "demo_result.json").write_text("{}")
    done = subprocess.run([sys.executable, "-m", "spanrl", "demo", "--quick", "--output-dir", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"spanrl: error: output_dir: {out} holds an earlier run (sft, demo_result.json): start over with "
        "--overwrite (removes that run), or choose another --output-dir"]
