"""The online trainer from a YAML/JSON config, and its terminal lines (``spanrl train --online CONFIG``: the
``--online`` path of ``trainer/_cli.py``).

The config has `OnlineConfig`'s fields at the top level, plus the algorithm (GRPO only: the update
must take its ratio against the recorded sampling log-probs); every key: docs/online-config.md::

    model: tiny-model/                 # the folder `spanrl serve` was started with
    server_url: http://127.0.0.1:8000  # the running policy server
    store_url: http://127.0.0.1:4318   # the collector (its SQL endpoint)
    output_dir: online-run/
    algorithm: {name: grpo, learning_rate: 1.0e-5}
    min_rollouts: 8
    max_policy_lag: 2
    max_age_s: 600

``spanrl train --online`` runs it until SIGTERM / SIGINT (then finishes the current update and exits 0),
``max_updates`` or ``max_seconds``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from spanrl.errors import ConfigError
from spanrl.trainer.reporting import Callback

__all__ = ["OnlineConsole", "build_online_trainer"]


def build_online_trainer(raw: dict[str, Any], *, base: Path = Path(".")) -> Any:
    """An `OnlineTrainer` from a parsed config mapping (see the module docstring)."""
    from spanrl.algorithms import GRPO
    from spanrl.algorithms.grpo import GRPOConfig
    from spanrl.trainer.online import OnlineConfig, OnlineTrainer
    from spanrl.trainer.train_config import check_keys

    if not isinstance(raw, dict):
        raise ConfigError("the online config must be a mapping of settings")
    raw = dict(raw)
    algo = dict(raw.pop("algorithm", None) or {"name": "grpo"})
    name = str(algo.pop("name", "grpo")).lower()
    if name != "grpo":
        raise ConfigError(f"algorithm.name must be 'grpo' for online training, got {name!r}")
    docs = "docs/online-config.md"
    check_keys(raw, {f.name for f in dataclasses.fields(OnlineConfig)} | {"algorithm"}, kind="an online trainer",
               docs=docs)
    check_keys(algo, {f.name for f in dataclasses.fields(GRPOConfig)}, section="algorithm", docs=docs)
    # as in `spanrl train`: the model is found beside the config, the output goes where the user runs it
    if isinstance(raw.get("model"), str) and not Path(raw["model"]).is_absolute():
        raw["model"] = str(base / raw["model"])
    return OnlineTrainer(OnlineConfig(**raw), algorithm=GRPO(**algo), callbacks=[OnlineConsole()])


class OnlineConsole(Callback):
    """What a person watching the terminal sees: one line per update and per guard verdict."""

    def on_row(self, row: Mapping[str, Any]) -> None:
        print(_verdict_line(row) if row.get("event") is not None else _update_line(row), flush=True)


def _update_line(row: Mapping[str, Any]) -> str:
    reward = "-" if row.get("reward_mean") is None else f"{row['reward_mean']:.2f}"
    lag = "-" if row.get("policy_lag_mean") is None else f"{row['policy_lag_mean']:.1f}"
    return (f"update {row['step']}: {row['rollouts']} rollouts, reward {reward}, lag {lag} versions, "
            f"now serving v{row.get('policy_version')} (stale {row.get('stale', 0)}, "
            f"aged out {row.get('aged_out', 0)}, trained {row.get('trained', 0)})")


def _verdict_line(row: Mapping[str, Any]) -> str:
    p_value = "-" if row.get("p_value") is None else f"{row['p_value']:.2g}"
    line = (f"guard: update {row['trial_step']} (v{','.join(map(str, row['trial_versions']))}) {row['event']}: "
            f"live reward {row['reward_new']:.2f} over {row['judged_new']} vs {row['reward_previous']:.2f} over "
            f"{row['judged_previous']} before (p {p_value})")
    if row["event"] == "rejected":
        line += f"; rolled back to {row['restored']}, now serving v{row['policy_version']}"
    return line
