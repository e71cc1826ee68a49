"""What the online trainer persists: its watermark, counters, baseline, and the ledger of rollouts.

The commit point of every step is one atomic write of ``online_state.json`` (temp file + rename). It
names the checkpoint it goes with and how many ledger lines are committed, so a crash anywhere leaves
either the old state or the new one: on restart the ledger is cut back to the committed lines and the
trainer resumes from the committed watermark and checkpoint. A rollout is in the committed ledger at
most once, and is trained only when it enters it.

The state holds the running baseline's statistics (``spanrl.algorithms.baseline.RunningBaseline``,
credit assignment's ``running`` baseline); a state whose statistics are not finite (written before the
rewards were winsorized, issue 28) starts the baseline afresh.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spanrl.algorithms.baseline import RunningBaseline
from spanrl.store.online import Watermark

__all__ = ["Ledger", "OnlineState", "STATE_FILE", "LEDGER_FILE"]

_logger = logging.getLogger("spanrl.online")
STATE_FILE = "online_state.json"
LEDGER_FILE = "ledger.jsonl"


@dataclass
class OnlineState:
    """Everything needed to resume exactly; ``online_state.json`` in the output dir."""

    step: int = 0
    checkpoint: str | None = None  # folder name in the output dir, None before the first update
    watermark: Watermark = field(default_factory=Watermark)
    aged_until_ns: int = 0  # feedback windows closing at or before this were counted
    ledger_lines: int = 0
    bad_updates: int = 0  # updates in a row that were not finite (undone); 0 after a good one
    counters: dict[str, int] = field(default_factory=dict)
    baseline: RunningBaseline = field(default_factory=RunningBaseline)
    # Guarded updates (online/guard.py): the open trial of the newest update, if any; the policy
    # versions that served the committed weights (and since when, collector clock); every rejected version.
    trial: dict[str, Any] | None = None
    served_versions: list[int] = field(default_factory=list)
    served_since_ns: int = 0
    rejected_versions: list[int] = field(default_factory=list)

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + int(n)

    def save(self, output_dir: Path) -> None:
        """Atomically replace ``online_state.json`` (the step's commit point)."""
        path = Path(output_dir) / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, output_dir: Path, *, window: int, prior: float, clip_std: float = 4.0) -> "OnlineState":
        path = Path(output_dir) / STATE_FILE
        if not path.exists():
            return cls(baseline=RunningBaseline(window=window, prior=prior, clip_std=clip_std))
        raw: dict[str, Any] = json.loads(path.read_text())
        base = dict(raw.pop("baseline"))
        base.update(window=window, prior=prior, clip_std=clip_std)
        baseline = RunningBaseline(**base)
        if not baseline.finite():  # NaN / inf saved by a run before the rewards were checked: start afresh
            _logger.warning("online state %s: the running baseline was not finite (mean %r, var %r); "
                            "starting it afresh", path, baseline.mean, baseline.var)
            baseline = RunningBaseline(window=window, prior=prior, clip_std=clip_std)
        return cls(watermark=Watermark(**raw.pop("watermark")), baseline=baseline, **raw)


class Ledger:
    """``ledger.jsonl``: one line per rollout the trainer handled, once: ``{"rollout_id", "step", "status", "reward",
    "policy_lag", ...}`` with status ``trained`` | ``stale`` (more than K versions behind) |
    ``no_transitions`` (no token-level calls) | ``bad_reward`` (no usable reward: non-finite or out of range)
    | ``bad_transitions`` (its transitions fail the algorithm's checks, e.g. a token id outside the
    vocabulary) | ``bad_update`` (in an update whose gradients or weights were not finite: skipped) |
    ``rejected_version`` (served by a policy version the guard rolled back: judged, never trained). A
    guarded update that was rolled back is one line without a rollout id: ``{"event": "rejected_update",
    "step", "checkpoint", "rejected_versions", "restored", "policy_version", "reward_new", ...}``."""

    def __init__(self, output_dir: Path, committed_lines: int) -> None:
        self.path = Path(output_dir) / LEDGER_FILE
        lines = self.path.read_text().splitlines(keepends=True) if self.path.exists() else []
        if len(lines) != committed_lines:  # a crash between append and commit: drop the uncommitted tail
            self.path.write_text("".join(lines[:committed_lines]))
        self.lines = min(len(lines), committed_lines)
        entries = [json.loads(line) for line in lines[:committed_lines]]
        self.seen: set[str] = set()
        self.trained: set[str] = set()
        self._note(entries)

    def append(self, entries: list[dict[str, Any]]) -> None:
        if not entries:
            return
        with open(self.path, "a") as handle:
            handle.write("".join(json.dumps(e) + "\n" for e in entries))
            handle.flush()
            os.fsync(handle.fileno())
        self.lines += len(entries)
        self._note(entries)

    def _note(self, entries: list[dict[str, Any]]) -> None:
        rollouts = [e for e in entries if "rollout_id" in e]  # event lines (a rejected update) name none
        self.seen.update(e["rollout_id"] for e in rollouts)
        self.trained.update(e["rollout_id"] for e in rollouts if e["status"] == "trained")
