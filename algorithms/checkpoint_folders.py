"""A run folder's checkpoints: ``checkpoint-<step>/`` holds the algorithm's HF folder and state (written by
the algorithm, ``checkpoints.py``) plus ``trainer_state.json`` (step, history, resolved config), which marks a
Trainer's complete (the online trainer's commit point is its ``online_state.json``, which names the checkpoint).

Here, below the trainer that writes them and the commands that read them (``spanrl export model`` in
serving/_cli.py takes a run folder's newest), and without torch: the viewer reads the names too."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "CHECKPOINT_PREFIX", "TRAINER_STATE_FILE", "latest", "path_of", "prune", "read_trainer_state",
    "write_trainer_state",
]

CHECKPOINT_PREFIX = "checkpoint-"
TRAINER_STATE_FILE = "trainer_state.json"


def path_of(output_dir: Path, step: int) -> Path:
    return output_dir / f"{CHECKPOINT_PREFIX}{step}"


def _numbered(output_dir: Path) -> list[tuple[int, Path]]:
    """Every ``checkpoint-<step>`` folder in ``output_dir``, oldest step first."""
    found: list[tuple[int, Path]] = []
    for path in output_dir.glob(f"{CHECKPOINT_PREFIX}*"):
        match = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest(output_dir: Path) -> Path | None:
    """The newest ``checkpoint-<step>`` folder holding a trainer state, or None."""
    found = [path for _, path in _numbered(output_dir) if (path / TRAINER_STATE_FILE).is_file()]
    return found[-1] if found else None


def prune(output_dir: Path, keep: int, *, protect: Path | Iterable[Path] | None = None) -> list[Path]:
    """Remove all but the newest ``keep`` checkpoint folders, never ``protect`` (the committed one, or several);
    returns those removed."""
    found = _numbered(output_dir)
    kept = {p.name for p in ([protect] if isinstance(protect, Path) else protect or [])}
    removed = [path for _, path in found[:max(len(found) - keep, 0)] if path.name not in kept]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def write_trainer_state(path: Path, *, step: int, history: list[dict[str, Any]], config: dict[str, Any]) -> None:
    state = {"step": step, "history": history, "config": config}
    (path / TRAINER_STATE_FILE).write_text(json.dumps(state, indent=1, default=str))


def read_trainer_state(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """``(step, history)`` saved in ``path``."""
    state = json.loads((path / TRAINER_STATE_FILE).read_text())
    return int(state["step"]), list(state.get("history", []))
