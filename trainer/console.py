"""What a person sees while the Trainer runs: a progress bar and one short line per step.

    step  3/30  reward 0.62  held-out 0.80  kl 0.0012  rollouts 128  12.3 s

Whole rows (every metric) go to the log file through :class:`spanrl.trainer.reporting.RowLog`; the
terminal gets this line. The Trainer adds the console to its callbacks when ``progress`` is on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
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
    """A line per recorded row, an ordinary callback like the others; while the loop runs
    (``with console.running(done):``) a rich progress bar of the steps, plus one bar per batch of
    rollouts (:meth:`rollout_bar`), on a terminal."""

    def __init__(self, *, max_steps: int) -> None:
        self.max_steps = max_steps
        self._progress: Any = None
        self._steps_bar: Any = None

    @contextlib.contextmanager
    def running(self, done: int = 0) -> Iterator[Console]:
        """The progress bar from ``done`` steps until the block ends (output captured or piped: none,
        the step lines only)."""
        from rich.console import Console as RichConsole
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if self._progress is None and RichConsole().is_terminal:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=True
            )
            self._progress.start()
            self._steps_bar = self._progress.add_task("steps", total=self.max_steps, completed=done)
        try:
            yield self
        finally:
            self.close()

    def rollout_bar(self, mode: str, total: int) -> tuple[Callable[[], None], Callable[[], None]]:
        """``(advance, remove)`` for a bar over ``total`` rollouts (no-ops without a progress bar)."""
        if self._progress is None:
            return (lambda: None), (lambda: None)
        progress = self._progress
        bar = progress.add_task(f"rollouts ({mode})", total=total)
        return (lambda: progress.advance(bar)), (lambda: progress.remove_task(bar))

    def on_row(self, row: Mapping[str, Any]) -> None:
        if self._progress is None:
            print(step_line(row, self.max_steps), flush=True)
            return
        self._progress.console.print(step_line(row, self.max_steps), highlight=False)
        step = row.get("step")
        if isinstance(step, int):
            self._progress.update(self._steps_bar, completed=step)

    def close(self) -> None:
        """Stop the progress bar; safe twice (the lines go on, plain)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
