"""``spanrl train --online CONFIG``: the online trainer from a YAML/JSON config, and its terminal lines.

``register`` adds ``--online`` to the ``train`` command ``trainer/_cli.py`` registers (one parser, one
error format), so trainer/ knows nothing of this room: the CLI registers this module after trainer's.

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

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Mapping

from spanrl.errors import ConfigError
from spanrl.trainer.cli_output import log_file
from spanrl.trainer.reporting import Callback
from spanrl.trainer.train_config import read_config

__all__ = ["OnlineConsole", "build_online_trainer", "register"]


def register(subparsers: Any) -> None:
    """``--online`` on the ``train`` command (registered before this, by ``spanrl.trainer._cli``)."""
    train = subparsers.choices["train"]
    train.add_argument("--online", action="store_true",
                       help="follow a running collector and policy server: train on live traffic "
                            "(its keys: docs/online-config.md); --max-steps then overrides max_updates, and "
                            "--json's line holds step, updates_this_run, output_dir and the ledger's counters")
    train.set_defaults(func=_dispatch(train.get_default("func")))


def _dispatch(offline: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def train(args: argparse.Namespace) -> int:
        if not args.online:
            return offline(args)
        path = Path(args.config)
        return _train_online(read_config(path), args, base=path.parent)

    return train


def _train_online(raw: dict[str, Any], args: argparse.Namespace, *, base: Path) -> int:
    """``--online``: the online trainer (``build_online_trainer``) until SIGTERM / SIGINT (the current update
    finishes, exit 0), ``max_updates`` or ``max_seconds``; ``--json``: a one-line summary at the end. An error
    ends it as it ends every ``spanrl`` command (``spanrl.cli``: `errors.cli_error`, the error's own exit
    status): 2 for a bad config or a server that refuses this trainer's reloads at start, 1 for a failed run."""
    import signal

    from spanrl.online.config import OnlineConfig

    if args.output_dir:
        raw["output_dir"] = args.output_dir
    if args.max_steps is not None:
        raw["max_updates"] = args.max_steps
    log_file(Path(str(raw.get("output_dir", OnlineConfig.output_dir))), args)  # before transformers loads
    trainer = build_online_trainer(raw, base=base)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: trainer.stop())
    with trainer:  # start(); close() at the end
        print(f"spanrl online ready step={trainer.state.step} output_dir={trainer.output_dir}", flush=True)
        history = trainer.run()
    if args.json:
        print(json.dumps({"step": trainer.state.step, "updates_this_run": len(history),
                          "output_dir": str(trainer.output_dir), **trainer.state.counters}), flush=True)
    return 0


def build_online_trainer(raw: dict[str, Any], *, base: Path = Path(".")) -> Any:
    """An `OnlineTrainer` from a parsed config mapping (see the module docstring)."""
    from spanrl.algorithms import GRPO
    from spanrl.algorithms.grpo import GRPOConfig
    from spanrl.algorithms.presets import coupled_credit
    from spanrl.online.config import OnlineConfig
    from spanrl.online.trainer import OnlineTrainer
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
    algorithm = GRPO(**algo)
    # the field the algorithm's preset couples (Dr. GRPO: scale_std false), where the config is silent
    raw = {**coupled_credit(algorithm.config), **raw}
    return OnlineTrainer(OnlineConfig(**raw), algorithm=algorithm, callbacks=[OnlineConsole()])


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
