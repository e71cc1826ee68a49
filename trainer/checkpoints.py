"""Run checkpoints: ``checkpoint-<step>/`` holds the algorithm's HF folder and state (written by the
algorithm) plus ``trainer_state.json`` (step, history, resolved config), which marks it complete."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from spanrl.trainer.config import CHECKPOINT_PREFIX, TRAINER_STATE_FILE

__all__ = ["latest", "path_of", "read_trainer_state", "write_trainer_state"]


def path_of(output_dir: Path, step: int) -> Path:
    return output_dir / f"{CHECKPOINT_PREFIX}{step}"


def latest(output_dir: Path) -> Path | None:
    """The newest ``checkpoint-<step>`` folder holding a trainer state, or None."""
    found: list[tuple[int, Path]] = []
    for path in output_dir.glob(f"{CHECKPOINT_PREFIX}*"):
        match = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", path.name)
        if match and (path / TRAINER_STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return max(found)[1] if found else None


def write_trainer_state(path: Path, *, step: int, history: list[dict[str, Any]], config: dict[str, Any]) -> None:
    state = {"step": step, "history": history, "config": config}
    (path / TRAINER_STATE_FILE).write_text(json.dumps(state, indent=1, default=str))


def read_trainer_state(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """``(step, history)`` saved in ``path``."""
    state = json.loads((path / TRAINER_STATE_FILE).read_text())
    return int(state["step"]), list(state.get("history", []))
