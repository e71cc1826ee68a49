"""Where a bench leaves its figures for `bench/report.py`: ``record(bench, figures)`` writes
``<bench>.json`` into the folder named by ``SPANRL_BENCH_RESULTS``; unset, it does nothing.

Standard library only. Several calls from one process (e.g. one per stage of a bench) merge into the same
file; a file left by another process is replaced, so an old run's figures never mix with a new one's.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from spanrl.env import SPANRL_BENCH_RESULTS


def record(bench: str, figures: dict[str, Any]) -> Path | None:
    """Write (or merge into) ``$SPANRL_BENCH_RESULTS/<bench>.json``; returns its path, None when unset."""
    folder = os.environ.get(SPANRL_BENCH_RESULTS)
    if not folder:
        return None
    path = Path(folder) / f"{bench}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    merged: dict[str, Any] = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
        if old.get("pid") == os.getpid():
            merged = old.get("figures", {})
    merged.update(figures)
    doc = {"bench": bench, "pid": os.getpid(), "argv": sys.argv,
           "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "figures": merged}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True, default=str))
    tmp.replace(path)
    return path
