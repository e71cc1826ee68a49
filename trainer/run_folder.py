"""A run folder is never silently reused: a Trainer starting in an ``output_dir`` that holds another run
continues it (``resume``), starts over (``overwrite``: the run's files are removed first), or refuses,
naming both. Rerunning into a folder used to train from scratch over the old checkpoints, append to its
history, mix both runs in one span store and keep the old tiny model (whose words may lack the new tasks')."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from spanrl.errors import ConfigError
from spanrl.trainer.config import (
    APO_RESULT_FILE,
    CHECKPOINT_PREFIX,
    CONFIG_FILE,
    CURVE_FILE,
    DB_FILE,
    HISTORY_FILE,
    ROLLOUTS_FILE,
)

__all__ = ["claim_output_dir", "run_files"]

# What a run writes (spanrl.log is not here: the command opens it before the Trainer starts).
_RUN_FILES = (CONFIG_FILE, HISTORY_FILE, ROLLOUTS_FILE, DB_FILE, f"{DB_FILE}.wal", CURVE_FILE, APO_RESULT_FILE, "runs")


def run_files(output_dir: Path) -> list[Path]:
    """The files and folders of an earlier run in ``output_dir`` (none: a new or empty folder)."""
    if not output_dir.is_dir():
        return []
    found = [output_dir / name for name in _RUN_FILES if (output_dir / name).exists()]
    return found + sorted(output_dir.glob(f"{CHECKPOINT_PREFIX}*"))


def claim_output_dir(output_dir: Path, *, resume: bool, overwrite: bool, markers: Sequence[str] = (),
                     also: Sequence[str] = (), can_resume: bool = True) -> None:
    """Refuse an ``output_dir`` holding an earlier run (:func:`run_files`, or the files named in ``markers``)
    unless ``resume`` or ``overwrite``; with ``overwrite`` remove that run's files first, and those named in
    ``also`` (e.g. the tiny model built there). ``can_resume=False`` (the demos) offers ``--overwrite`` alone."""
    if resume and overwrite:
        raise ConfigError("resume and overwrite are both set: --resume continues the run in output_dir, "
                          "--overwrite removes it and starts over; give one")
    found = run_files(output_dir) + [output_dir / name for name in markers if (output_dir / name).exists()]
    if overwrite:
        for path in found + [output_dir / name for name in also]:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    elif found and not resume:
        names = ", ".join(p.name for p in found[:4]) + (", ..." if len(found) > 4 else "")
        how = "continue it with --resume (resume: true), start over with --overwrite (overwrite: true; removes that " \
              "run)" if can_resume else "start over with --overwrite (removes that run)"
        raise ConfigError(f"output_dir: {output_dir} holds an earlier run ({names}): {how}, or choose another "
                          "--output-dir")
