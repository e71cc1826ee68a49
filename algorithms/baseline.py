"""The ``running`` baseline of credit assignment (``CreditConfig(baseline="running")``, credit.py).

For rewards that arrive one rollout at a time (the online trainer, production traffic): there are no
sampled groups to compare within, so each rollout's episode reward ``R`` is compared with the rewards
of the rollouts seen *before* its batch, kept as running statistics (``RunningBaseline``, persisted by
the caller). For rollout ``i`` of task ``tau`` in a batch:

    R~_i = clip(R_i, med - c * max(s, 1), med + c * max(s, 1))       winsorized (c: ``clip_std``)
    b_tau = (n_tau * m_tau + kappa * m) / (n_tau + kappa)           per-task mean shrunk to the global one
    A_i = (R~_i - b_tau) / sigma                                     (sigma: 1 without ``scale_std``)

``med``, ``s``: the median and 1.4826 x the median absolute deviation of the last ``W`` rewards as they came
(``recent``; rank-based: a reward's size does not move them); ``m``, ``sigma ** 2``: the global running mean and
variance of the winsorized rewards; ``n_tau``, ``m_tau``: the task's count and
running mean; ``kappa``: ``prior`` (pseudo-observations of the global mean; a task never seen has
``b = m``). After the batch's advantages, each ``R~`` is observed with a window ``W``
(``k = min(n, W)``): ``m <- m + (R~ - m) / k``, ``sigma ** 2 <- sigma ** 2 + ((R~ - m_old) * (R~ - m_new) -
sigma ** 2) / k``, ``m_tau <- m_tau + (R~ - m_tau) / min(n_tau, W)``, so the baseline follows the improving
policy and (after the first batch) a rollout's own reward never enters its baseline. The first batch
(``n = 0``) starts ``m`` and ``sigma`` from itself, winsorized to its median +- ``c * max(1.4826 * MAD, 1)``;
``sigma`` below 1e-6 counts as 1.

Why winsorized (issue 28): one 1e30 reward left every later advantage of its task at about -0.38 for
thousands of rollouts. Why around the median and MAD, not ``m +- c * sigma`` (issue 53): a band that follows
``sigma`` widens with each clipped observation, so one legal 1e6 reward in every batch of 8 grew ``sigma``
~1.25x a batch and the honest 1-vs-0 advantage gap fell from 0.43 to 0.0001 in 40 batches; the median and MAD
of the recent rewards do not move while fewer than half of them are outliers, so the band, ``sigma`` and the
gap stay bounded (0.43 after the first such batch, 0.61 after 40; 2.0 without the outlier). A real shift of the
reward scale is still followed once it fills half of the last ``W`` rewards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spanrl.errors import ConfigError

__all__ = ["RunningBaseline", "running_advantages"]

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
    recent: list[float] = field(default_factory=list)  # the last `window` rewards, as they came (the clip band's)

    def value(self, task_id: str | None) -> float:
        """``b_tau``: the task's running mean shrunk towards the global one (the global one for None)."""
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
        self.recent = [*self.recent, *(r for _, r in rewards)][-self.window:]
        return out

    def winsorize(self, reward: float) -> float:
        """``reward`` clipped to ``median +- clip_std * max(1.4826 * MAD, 1)`` of the recent rewards (before any:
        ``mean +- clip_std * max(std, 1)``; see the module docstring)."""
        if not self.recent:
            centre, scale = self.mean, math.sqrt(max(self.var, 0.0))
        else:
            centre = _median(self.recent)
            scale = 1.4826 * _median([abs(v - centre) for v in self.recent])
        band = self.clip_std * max(scale, 1.0)
        return min(max(reward, centre - band), centre + band)

    def finite(self) -> bool:
        """Whether every statistic is a finite number (a state poisoned before the winsorizing is not)."""
        return all(math.isfinite(x) for x in (self.mean, self.var, *self.recent, *(m for _, m in self.tasks.values())))

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


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def running_advantages(config: Any, running: tuple[RunningBaseline, Sequence[str | None]] | None,
                       episode: np.ndarray, keep: np.ndarray, rollout_group: np.ndarray) -> np.ndarray:
    """Per rollout: ``A_i`` of its episode reward (NaN when not kept), the kept ones observed after.

    ``running``: the baseline's state (updated in place) and the task id of each group index."""
    if running is None:
        raise ConfigError("baseline 'running' compares with earlier batches: pass running=(RunningBaseline, "
                          "task id per group) to assign_credit (the online trainer keeps one)")
    if config.mode != "identical" or config.step_group_weight:
        raise ConfigError(f"baseline 'running' takes mode 'identical' and no step_group_weight, got mode "
                          f"{config.mode!r}, step_group_weight {config.step_group_weight!r}")
    state, task_ids = running
    kept = np.flatnonzero(keep)
    out = np.full(len(episode), np.nan)
    rewards = [(task_ids[int(rollout_group[i])], float(episode[i])) for i in kept]
    out[kept] = state.advantages(rewards, scale_std=config.scale_std)
    return out
