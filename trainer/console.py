"""What a person sees while the Trainer runs: a progress bar and one short line per step.

    step  3/30  reward 0.62  held-out 0.80  kl 0.0012  rollouts 128  12.3 s

Whole rows (every metric) go to the log file through :func:`spanrl.trainer.reporting.log_row`; the
terminal gets this line. With ``enabled=False`` (``progress=False``) nothing is printed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from spanrl.trainer.reporting import Callback

__all__ = ["Console", "step_line"]

# (row key, label, format) in the order the line shows them
_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("reward_mean", "reward", "{:.2f}"),
    ("val_success", "held-out", "{:.2f}"),
    ("losses/approx_kl", "kl", "{:.4f}"),
    ("apo/best_score", "best prompt", "{:.2f}"),
    ("rollouts_ok", "rollouts", "{:d}"),
    ("rollouts_failed", "failed", "{:d}"),
    ("time/step_s", "", "{:.1f} s"),
)


def step_line(row: Mapping[str, Any], max_steps: int | None = None) -> str:
    """The one-line summary of a history row (fields it lacks, and zero failures, are left out)."""
    step = row.get("step")
    width = len(str(max_steps)) if max_steps else 1
    parts = [f"step {step:>{width}}/{max_steps}" if max_steps else f"step {step}"]
    for key, label, fmt in _FIELDS:
        value = row.get(key)
        if value is None or isinstance(value, bool) or (key == "rollouts_failed" and not value):
            continue
        try:
            text = fmt.format(int(value) if fmt == "{:d}" else float(value))
        except (TypeError, ValueError):
            continue
        parts.append(f"{label} {text}" if label else text)
    return "  ".join(parts)


class Console(Callback):
    """A rich progress bar (steps, plus one bar per batch of rollouts) and a line per recorded row.

    Use as a context manager around the loop; :meth:`rollout_bar` gives the runner's ``advance``."""

    def __init__(self, *, enabled: bool, max_steps: int, done: int = 0) -> None:
        self.enabled = enabled
        self.max_steps = max_steps
        self._done = done
        self._progress: Any = None
        self._steps_bar: Any = None

    def __enter__(self) -> Console:
        if self.enabled:
            from rich.console import Console as RichConsole
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            if not RichConsole().is_terminal:  # output captured or piped: the step lines only
                return self
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True
            )
            self._progress.start()
            self._steps_bar = self._progress.add_task("steps", total=self.max_steps, completed=self._done)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rollout_bar(self, mode: str, total: int) -> tuple[Callable[[], None], Callable[[], None]]:
        """``(advance, remove)`` for a bar over ``total`` rollouts (no-ops when disabled)."""
        if self._progress is None:
            return (lambda: None), (lambda: None)
        progress = self._progress
        bar = progress.add_task(f"rollouts ({mode})", total=total)
        return (lambda: progress.advance(bar)), (lambda: progress.remove_task(bar))

    def on_row(self, row: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            print(step_line(row, self.max_steps), flush=True)
            return
        self._progress.console.print(step_line(row, self.max_steps), highlight=False)
        step = row.get("step")
        if isinstance(step, int):
            self._progress.update(self._steps_bar, completed=step)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
