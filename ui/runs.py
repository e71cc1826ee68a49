"""Training runs: a run is an output folder with ``history.jsonl`` (one row per step, written by the
Trainer), and ``config.json`` beside it. The store adds the policy version over time."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Sequence

from spanrl.trainer.config import CONFIG_FILE, HISTORY_FILE
from spanrl.ui.source import Source

__all__ = ["HISTORY_FILE", "Run", "discover_runs", "policy_versions"]

_logger = logging.getLogger(__name__)


_VERSIONS_SQL = """
SELECT policy_version AS version, min(start_ns) AS first_ns, max(end_ns) AS last_ns, count(*) AS calls
FROM spans
WHERE policy_version IS NOT NULL AND completion_token_ids IS NOT NULL
GROUP BY policy_version
ORDER BY first_ns
"""


class Run:
    """One run folder; its history is read again on every `read` (a running trainer appends to it)."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name

    def config(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return {}

    def read(self) -> dict[str, Any]:
        rows: list[dict[str, Any]] = []
        bad = 0
        try:
            lines = (self.path / HISTORY_FILE).read_text().splitlines()
        except OSError as exc:
            return {"name": self.name, "path": str(self.path), "rows": [], "error": str(exc)}
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                bad += 1  # a line being written right now, or a damaged one
                continue
            rows.append({k: _finite(v) for k, v in row.items() if not isinstance(v, (dict, list))})
        config = self.config()
        algorithm = (config.get("algorithm") or {}).get("name")
        return {"name": self.name, "path": str(self.path), "algorithm": algorithm, "rows": rows, "bad_lines": bad}


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def discover_runs(paths: Sequence[str | Path], db: str | None) -> list[Run]:
    """The runs named on the command line (a run folder, or a folder of run folders), else those beside
    the DuckDB file (the demo keeps ``spans.duckdb`` next to its ``sft/`` and ``grpo/`` runs)."""
    folders = [Path(p) for p in paths]
    if not folders and db:
        folders = [Path(db).resolve().parent]
    runs: list[Run] = []
    for folder in folders:
        if (folder / HISTORY_FILE).is_file():
            runs.append(Run(folder, folder.name or str(folder)))
            continue
        found = sorted(p.parent for p in folder.glob(f"*/{HISTORY_FILE}")) if folder.is_dir() else []
        if not found and paths:
            _logger.warning("%s holds no %s (nor do its sub-folders); no run read there", folder, HISTORY_FILE)
        runs.extend(Run(p, p.name) for p in found)
    names: set[str] = set()
    for run in runs:  # two runs called "grpo" in different folders: keep both, tell them apart
        if run.name in names:
            run.name = f"{run.path.parent.name}/{run.name}"
        names.add(run.name)
    return runs


def policy_versions(source: Source) -> list[dict[str, Any]]:
    """Each policy version the server stamped on calls: when it first and last served, how many calls."""
    return source.sql(_VERSIONS_SQL).to_pylist()
