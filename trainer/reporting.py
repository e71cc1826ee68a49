"""Reporting as callbacks: every history row goes to each :class:`Callback` in turn, and nowhere else.

One contract (``on_row(row)``, ``on_end(history)``, ``close()``) for everything that reports:

- :class:`HistoryFile`: ``history.jsonl`` (one JSON line per row);
- :class:`RowLog`: the whole row to the log file;
- :class:`Scalars`: TensorBoard / W&B (``report_to``), the only scalar writer;
- :class:`~spanrl.trainer.console.Console`: the progress bar and one readable line per step;
- :class:`CurvePlot`: ``reward_curve.png`` at the end;
- :class:`NonFiniteGuard`: the one non-finite policy, judged by the training step after each update
  (``training_step.py``): stops training after ``max_bad_updates`` bad updates in a row.

Algorithms return their metrics and write no reports (their HF trainers run with ``report_to="none"``);
the Trainer merges them into the step's row, so each key is written once per step.

A row is a flat dict with ``step`` plus numbers (and a few lists / dicts, e.g. ``transitions_report``);
a step's seconds per stage come from a :class:`StageClock` as ``time/<stage>_s``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "Callback", "CurvePlot", "HistoryFile", "NonFiniteGuard", "REPORTERS", "RowLog", "Scalars", "StageClock",
    "check_report_to", "scalars_of",
]

_logger = logging.getLogger(__name__)

REPORTERS = ("none", "tensorboard", "wandb")
"""What ``report_to`` may name."""


def check_report_to(report_to: str | Sequence[str]) -> list[str]:
    """``report_to`` as a list without ``none``, each entry one of ``none``, ``tensorboard``, ``wandb``."""
    if isinstance(report_to, str):
        report_to = [report_to]
    for name in report_to:
        if name not in REPORTERS:
            from spanrl.errors import ConfigError

            raise ConfigError(f"report_to entries must be one of {REPORTERS}, got {name!r}")
    return [r for r in report_to if r != "none"]


class Callback:
    """Receives each history row as it is recorded, the whole history at the end, then ``close()``."""

    def on_row(self, row: Mapping[str, Any]) -> None:
        """A row was recorded (a training step, an evaluation, an APO candidate)."""

    def on_end(self, history: Sequence[Mapping[str, Any]]) -> None:
        """``train()`` finished its steps; ``history`` holds every row."""

    def close(self) -> None:
        """Release what the callback holds (files, writers); safe twice."""


class HistoryFile(Callback):
    """Appends each row to ``path`` (``history.jsonl``) as one JSON line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_row(self, row: Mapping[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


class NonFiniteGuard(Callback):
    """The one non-finite policy (issue 28) of both trainers. An update whose loss (``losses/*``), gradient norm
    (``charts/grad_norm``) or, given the algorithm, a weight is not finite counts as bad, a good one resets the
    count, and the ``max_bad``-th bad one in a row stops training with `TrainingError` naming it. The training step
    judges each update and never pushes a bad one; what is undone is its source's: the online trainer loads its last
    good checkpoint and quarantines the update's rollouts; in the Trainer GRPO and PPO skip a non-finite optimizer
    step. ``on_row`` judges a recorded row the same way, for a loop of one's own."""

    def __init__(self, max_bad: int, *, bad: int = 0) -> None:
        self.max_bad = max_bad
        self.bad = bad
        """Bad updates in a row so far (the online trainer keeps it in its committed state)."""

    def judge(self, metrics: Mapping[str, Any], algorithm: Any = None) -> str | None:
        """What was not finite after an update (counted), or None: a good update (the count resets), or a row
        with no update (an evaluation, APO; SFT with nothing selected or DPO without pairs: a NaN loss)."""
        checked = {k: v for k, v in metrics.items() if (k.startswith("losses/") or k == "charts/grad_norm")
                   and isinstance(v, (int, float))}
        if algorithm is None and not checked or metrics.get("charts/update_seconds") == 0.0:
            return None
        problem = next((f"{k} = {v}" for k, v in checked.items() if not math.isfinite(v)), None)
        if problem is None and algorithm is not None:
            problem = _nonfinite_weight(algorithm)
        self.bad = self.bad + 1 if problem else 0
        return problem

    def stop_if_too_many(self, problem: str, *, last_good: str = "The last checkpoint is the last good one") -> None:
        """`TrainingError` once ``max_bad`` updates in a row were bad (``problem``: the last one's)."""
        if self.bad >= self.max_bad:
            from spanrl.errors import TrainingError

            raise TrainingError(f"{self.bad} updates in a row were not finite (max_bad_updates {self.max_bad}; last: "
                                f"{problem}); stopped. {last_good}; lower the learning rate or check the rewards")

    def on_row(self, row: Mapping[str, Any]) -> None:
        problem = self.judge(row)
        if problem:
            self.stop_if_too_many(f"{problem} at step {row.get('step')}")


def _nonfinite_weight(algorithm: Any) -> str | None:
    from spanrl.algorithms.checkpoints import nonfinite_tensors

    model = getattr(algorithm, "model", None)  # the live model (a LoRA one unmerged: no copy)
    bad = nonfinite_tensors(model.state_dict() if model is not None else algorithm.policy_weights())
    return f"weight {bad[0]} is not finite" if bad else None


def scalars_of(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's numbers as scalar tags: a key with a section (``losses/``, ``charts/``, ``time/``, ``apo/``)
    as it is; the Trainer's own keys under ``trainer/`` (``reward_mean``: the rollouts' mean final reward,
    not the algorithm's ``charts/reward_mean`` of its transitions; one tag each)."""
    return {
        ("trainer/" + k if "/" not in k else k): float(v)
        for k, v in row.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


class Scalars(Callback):
    """TensorBoard (``output_dir/runs``, the config as text) and/or W&B scalars, one write per row."""

    def __init__(self, report_to: Sequence[str], output_dir: Path, config: dict[str, Any]) -> None:
        self._writers: list[Any] = []
        for name in check_report_to(report_to):
            if name == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter

                writer = SummaryWriter(log_dir=str(Path(output_dir) / "runs"))
                writer.add_text("config", json.dumps(config, indent=2, default=str))
                self._writers.append(writer)
            elif name == "wandb":
                try:
                    import wandb
                except ImportError:
                    from spanrl.errors import ConfigError

                    raise ConfigError("report_to='wandb' needs the wandb package: pip install wandb") from None
                self._writers.append(wandb.run or wandb.init(project="spanrl", config=config, dir=str(output_dir)))

    def on_row(self, row: Mapping[str, Any]) -> None:
        scalars, step = scalars_of(row), int(row["step"])
        for writer in self._writers:
            if hasattr(writer, "add_scalar"):
                for key, value in scalars.items():
                    writer.add_scalar(key, value, step)
                writer.flush()
            else:
                writer.log(scalars, step=step)

    def close(self) -> None:
        """Close the TensorBoard writers and finish the W&B run; safe twice."""
        for writer in self._writers:
            if hasattr(writer, "add_scalar"):
                writer.close()
            else:
                writer.finish()
        self._writers = []


class CurvePlot(Callback):
    """``reward_curve.png`` from the history when training ends."""

    def __init__(self, path: Path, title: str) -> None:
        self.path, self.title = path, title

    def on_end(self, history: Sequence[Mapping[str, Any]]) -> None:
        from spanrl.trainer.plotting import plot_reward_curve

        plot_reward_curve(history, self.path, title=self.title)


class RowLog(Callback):
    """The whole row, for the log file (the terminal shows the console's short line instead)."""

    def on_row(self, row: Mapping[str, Any]) -> None:
        _logger.info("step %s: %s", row.get("step"), {k: v for k, v in row.items() if k != "step"})


class StageClock:
    """Seconds of one step's stages, for its history row: ``time/<stage>_s`` for each stage timed with
    ``with clock("stage"):`` (the named ones 0.0 when they did not run) and ``time/step_s`` since creation."""

    def __init__(self, *stages: str) -> None:
        self._started = time.perf_counter()
        self.seconds = dict.fromkeys(stages, 0.0)

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - started

    def row(self) -> dict[str, float]:
        row = {f"time/{k}_s": v for k, v in self.seconds.items()}
        return {**row, "time/step_s": time.perf_counter() - self._started}
