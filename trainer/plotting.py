"""The reward curve: training reward per step and held-out success, as a PNG (matplotlib, no display)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_reward_curve"]

_FIGSIZE_INCHES = (7.0, 4.0)
_DPI = 120


def plot_reward_curve(history: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "spanrl") -> Path:
    """Write ``path`` (PNG) from history rows: ``step`` with ``reward_mean`` (training rollouts) and/or
    ``val_success`` (held-out, greedy). Rows missing a key are skipped for that line. Returns the path."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=_FIGSIZE_INCHES)
    try:
        for key, label, style in (
            ("reward_mean", "training reward (mean per step)", "-"),
            ("val_success", "held-out success (greedy)", "o--"),
        ):
            points = [(row["step"], row[key]) for row in history if row.get(key) is not None and "step" in row]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel("reward")
        ax.set_ylim(-0.02, 1.02) if _in_unit_range(history) else None
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(path, dpi=_DPI)
    finally:
        plt.close(fig)
    return path


def _in_unit_range(history: Sequence[Mapping[str, Any]]) -> bool:
    values = [row[k] for row in history for k in ("reward_mean", "val_success") if row.get(k) is not None]
    return bool(values) and all(0.0 <= v <= 1.0 for v in values)
