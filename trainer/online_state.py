"""What the online trainer persists: its watermark, counters, baseline, and the ledger of rollouts.

The commit point of every step is one atomic write of ``online_state.json`` (temp file + rename). It
names the checkpoint it goes with and how many ledger lines are committed, so a crash anywhere leaves
either the old state or the new one: on restart the ledger is cut back to the committed lines and the
trainer resumes from the committed watermark and checkpoint. A rollout is in the committed ledger at
most once, and is trained only when it enters it.

The baseline (why this one: production rollouts arrive one at a time, so there are no sampled groups
to normalise within): a **per-task running mean**, shrunk towards the global running mean while a task
has few observations, ``b = (n_t * m_t + prior * m_g) / (n_t + prior)``. Means are windowed
(``m += (r - m) / min(n, window)``), so the baseline follows the improving policy. A rollout's own
reward never enters its baseline (the stats are updated after the batch's advantages are computed).

Robust to an outlier (issue 28: one 1e30 reward left every later advantage of its task at about -0.38
for thousands of rollouts): each reward is **winsorized** before it enters the advantage or the stats,
to ``mean +- clip_std * max(std, 1)`` (the first batch: its median +- ``clip_std`` x max(1.4826 MAD, 1)).
One outlier then moves a mean by at most ``clip_std * max(std, 1) / window``, and its weight fades with
the window; a real shift of the reward scale is followed within a few rollouts, since each clipped
observation still widens the std by up to ``clip_std`` deviations. A state whose stats are not finite
(written before this) starts the baseline afresh.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spanrl.store.online import Watermark

__all__ = ["Ledger", "OnlineState", "RunningBaseline", "STATE_FILE", "LEDGER_FILE"]

_logger = logging.getLogger("spanrl.trainer.online")
STATE_FILE = "online_state.json"
LEDGER_FILE = "ledger.jsonl"
_STD_EPS = 1e-6


@dataclass
class RunningBaseline:
    """Per-task windowed running mean of rewards, shrunk towards the global one (see the module doc)."""

    window: int = 20
    prior: float = 2.0
    clip_std: float = 4.0
    count: int = 0
    mean: float = 0.0
    var: float = 0.0
    tasks: dict[str, list[float]] = field(default_factory=dict)  # task -> [count, mean]

    def value(self, task_id: str | None) -> float:
        n_t, m_t = self.tasks.get(task_id, [0, 0.0]) if task_id is not None else (0, 0.0)
        return (n_t * m_t + self.prior * self.mean) / (n_t + self.prior)

    def advantages(self, rewards: list[tuple[str | None, float]], *, scale_std: bool) -> list[float]:
        """One advantage per ``(task_id, reward)``, against the baseline before this batch; then update."""
        if self.count == 0 and rewards:  # nothing seen yet: start from this batch's (winsorized) mean and spread
            values = sorted(r for _, r in rewards)
            median = values[len(values) // 2]
            mad = sorted(abs(v - median) for v in values)[len(values) // 2]
            band = self.clip_std * max(1.4826 * mad, 1.0)
            values = [min(max(v, median - band), median + band) for v in values]
            self.mean = sum(values) / len(values)
            self.var = sum((v - self.mean) ** 2 for v in values) / max(len(values) - 1, 1)
        std = math.sqrt(self.var) if self.var > _STD_EPS**2 else 1.0
        clipped = [(t, self.winsorize(r)) for t, r in rewards]
        out = [(r - self.value(t)) / (std if scale_std else 1.0) for t, r in clipped]
        for task_id, reward in clipped:
            self._observe(task_id, reward)
        return out

    def winsorize(self, reward: float) -> float:
        """``reward`` clipped to ``mean +- clip_std * max(std, 1)`` (see the module docstring)."""
        band = self.clip_std * max(math.sqrt(max(self.var, 0.0)), 1.0)
        return min(max(reward, self.mean - band), self.mean + band)

    def finite(self) -> bool:
        """Whether every statistic is a finite number (a state poisoned before the winsorizing is not)."""
        return all(math.isfinite(x) for x in (self.mean, self.var, *(m for _, m in self.tasks.values())))

    def _observe(self, task_id: str | None, reward: float) -> None:
        self.count += 1
        step = 1.0 / min(self.count, self.window)
        old = self.mean
        self.mean += (reward - old) * step
        self.var += ((reward - old) * (reward - self.mean) - self.var) * step
        if task_id is not None:
            n_t, m_t = self.tasks.get(task_id, [0, 0.0])
            n_t += 1
            self.tasks[task_id] = [n_t, m_t + (reward - m_t) / min(n_t, self.window)]


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
            _logger.warning("online state %s: the running baseline was not finite (mean %r, var %r); starting it afresh",
                            path, baseline.mean, baseline.var)
            baseline = RunningBaseline(window=window, prior=prior, clip_std=clip_std)
        return cls(watermark=Watermark(**raw.pop("watermark")), baseline=baseline, **raw)


class Ledger:
    """``ledger.jsonl``: one line per rollout the trainer handled, once: ``{"rollout_id", "step", "status",
    "reward", "policy_lag", ...}`` with status ``trained`` | ``stale`` (more than K versions behind) | ``no_transitions`` (no
    token-level calls) | ``bad_reward`` (no usable reward: non-finite or out of range) | ``bad_transitions`` (its
    transitions fail the algorithm's checks, e.g. a token id outside the vocabulary) | ``bad_update`` (in an
    update whose gradients or weights were not finite: skipped)."""

    def __init__(self, output_dir: Path, committed_lines: int) -> None:
        self.path = Path(output_dir) / LEDGER_FILE
        lines = self.path.read_text().splitlines(keepends=True) if self.path.exists() else []
        if len(lines) != committed_lines:  # a crash between append and commit: drop the uncommitted tail
            self.path.write_text("".join(lines[:committed_lines]))
        self.lines = min(len(lines), committed_lines)
        entries = [json.loads(line) for line in lines[:committed_lines]]
        self.seen = {e["rollout_id"] for e in entries}
        self.trained = {e["rollout_id"] for e in entries if e["status"] == "trained"}

    def append(self, entries: list[dict[str, Any]]) -> None:
        if not entries:
            return
        with open(self.path, "a") as handle:
            handle.write("".join(json.dumps(e) + "\n" for e in entries))
            handle.flush()
            os.fsync(handle.fileno())
        self.lines += len(entries)
        self.seen.update(e["rollout_id"] for e in entries)
        self.trained.update(e["rollout_id"] for e in entries if e["status"] == "trained")
