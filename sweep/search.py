"""``spanrl sweep SWEEP.yaml``: a grid or random search over train-config keys, as Ray Tune trials.

    train: train.yaml                 # the base train config (relative to this file), or an inline mapping
    search: grid                      # grid: every combination; random: num_samples draws
    num_samples: 1                    # grid: repeats of the whole grid; random: trials
    parameters:                       # dotted train-config keys -> values (grid) or distributions (random)
      algorithm.learning_rate: [1.0e-4, 5.0e-4]
      n_rollouts: [4, 8]
      credit.mode: {choice: [identical, discounted]}
      algorithm.beta: {loguniform: [1.0e-4, 1.0e-1]}
    metric: val_success               # the history key each trial is judged by (its last value; higher is better)
    output_dir: spanrl-sweep          # a folder per trial (its Trainer output_dir), Tune's own, spanrl.log
    address: null                     # a Ray cluster (ray.init's address); None: RAY_ADDRESS, else the Ray
                                      # running on this machine, else one started for the sweep ("local": always)
    resources_per_trial: {CPU: 1}
    max_concurrent_trials: 1

Each trial is one Trainer run (``build_trainer`` on the base config with the trial's values) in its own
folder; the command prints one line per trial and the best config. Ray's and Tune's own messages go to
``spanrl.log`` in ``output_dir`` (errors still reach the terminal).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError, one_of, positive_int
from spanrl.logs import log_to_file
from spanrl.rollouts.ray_start import init_ray
from spanrl.trainer.train_config import check_keys

__all__ = ["SweepConfig", "apply", "run_sweep"]

_SEARCHES = ("grid", "random")
_DISTRIBUTIONS = ("choice", "uniform", "loguniform", "randint")


@dataclasses.dataclass
class SweepConfig:
    """A sweep (see the module docstring)."""

    train: Any
    parameters: dict[str, Any]
    search: str = "grid"
    num_samples: int = 1
    metric: str = "val_success"
    output_dir: str = "spanrl-sweep"
    address: str | None = None
    resources_per_trial: dict[str, float] = dataclasses.field(default_factory=lambda: {"CPU": 1})
    max_concurrent_trials: int = 1

    @classmethod
    def load(cls, path: Path) -> tuple[SweepConfig, dict[str, Any], Path]:
        """The sweep, its base train config and the folder the base config's paths are relative to."""
        import yaml

        if not path.is_file():
            raise ConfigError(f"sweep: no such file {str(path)!r}")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict) or "train" not in raw or "parameters" not in raw:
            raise ConfigError(f"sweep: {path} must be a mapping with 'train' and 'parameters'")
        check_keys(raw, [f.name for f in dataclasses.fields(cls)], section="sweep")
        cfg = cls(**raw).validate()
        if isinstance(cfg.train, dict):
            return cfg, cfg.train, path.parent
        base_path = Path(cfg.train) if Path(cfg.train).is_absolute() else path.parent / cfg.train
        if not base_path.is_file():
            raise ConfigError(f"sweep.train: no such file {str(base_path)!r}")
        return cfg, yaml.safe_load(base_path.read_text()) or {}, base_path.parent

    def validate(self) -> SweepConfig:
        one_of("sweep.search", self.search, _SEARCHES)
        if not isinstance(self.parameters, dict) or not self.parameters:
            raise ConfigError("sweep.parameters must map train-config keys to values")
        for key, values in self.parameters.items():
            if isinstance(values, dict):
                if len(values) != 1 or next(iter(values)) not in _DISTRIBUTIONS:
                    raise ConfigError(f"sweep.parameters.{key} must be a list or one of {_DISTRIBUTIONS}")
            elif not isinstance(values, list) or not values:
                raise ConfigError(f"sweep.parameters.{key} must be a non-empty list of values, got {values!r}")
        positive_int("sweep.num_samples", self.num_samples)
        return self

    def space(self) -> dict[str, Any]:
        """The Ray Tune search space: lists are grid axes (grid) or choices (random)."""
        from ray import tune

        space = {}
        for key, values in self.parameters.items():
            if isinstance(values, dict):
                name, args = next(iter(values.items()))
                space[key] = tune.choice(args) if name == "choice" else getattr(tune, name)(*args)
            else:
                space[key] = tune.grid_search(values) if self.search == "grid" else tune.choice(values)
        return space


def apply(raw: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A copy of the train config ``raw`` with each dotted key set (``algorithm.learning_rate``)."""
    out = copy.deepcopy(raw)
    for dotted, value in values.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"sweep.parameters.{dotted}: {part} is not a mapping in the train config")
        node[leaf] = value
    return out


def _trial(values: dict[str, Any], *, raw: dict[str, Any], base: str, out: str, metric: str) -> None:
    """One Ray Tune trial: a Trainer run on the base config with ``values``, its last ``metric`` reported."""
    from ray import tune

    from spanrl.trainer.train_config import build_trainer

    name = tune.get_context().get_trial_name()
    trial_raw = apply(raw, values)
    trial_raw.update(output_dir=str(Path(out) / name), progress=False)
    history = build_trainer(trial_raw, base=Path(base)).train()
    scores = [row[metric] for row in history if isinstance(row.get(metric), (int, float))]
    tune.report({metric: scores[-1] if scores else float("nan"), "steps": len(history),
                 "output_dir": trial_raw["output_dir"]})


def run_sweep(path: Path, *, echo: Any = print, verbose: bool = False) -> list[dict[str, Any]]:
    """Run the sweep at ``path``; return one row per trial (its values, metric, folder, error)."""
    import ray

    cfg, raw, base = SweepConfig.load(path)
    out = Path(cfg.output_dir).resolve()
    log = log_to_file(out / "spanrl.log", verbose=verbose)
    _route_ray_logs()
    echo(f"full logs: {log}")
    owned = not ray.is_initialized()
    if owned:
        init_ray(cfg.address, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        with log.open("a", encoding="utf-8") as sink, contextlib.redirect_stdout(sink):  # Tune's banners
            grid = _tuner(cfg, raw, base, out).fit()
    finally:
        if owned:
            ray.shutdown()
    rows = []
    for result in grid:
        metrics = result.metrics or {}
        rows.append({"values": {k: result.config.get(k) for k in cfg.parameters}, cfg.metric: metrics.get(cfg.metric),
                     "output_dir": metrics.get("output_dir"), "error": str(result.error) if result.error else None})
    _print_table(rows, cfg.metric, echo)
    return rows


def _tuner(cfg: SweepConfig, raw: dict[str, Any], base: Path, out: Path) -> Any:
    import functools

    from ray import tune

    trainable = tune.with_resources(
        functools.partial(_trial, raw=raw, base=str(base.resolve()), out=str(out), metric=cfg.metric),
        {k.lower(): v for k, v in cfg.resources_per_trial.items()},
    )
    return tune.Tuner(
        trainable, param_space=cfg.space(),
        tune_config=tune.TuneConfig(num_samples=cfg.num_samples, max_concurrent_trials=cfg.max_concurrent_trials),
        run_config=tune.RunConfig(storage_path=str(out / "tune"), name="sweep", verbose=0),
    )


def _route_ray_logs() -> None:
    """Ray's logger writes to its own stderr handler; send its records to the log file like everyone's."""
    ray_logger = logging.getLogger("ray")
    for handler in list(ray_logger.handlers):
        ray_logger.removeHandler(handler)
    ray_logger.propagate = True


def _print_table(rows: list[dict[str, Any]], metric: str, echo: Any) -> None:
    for i, row in enumerate(rows):
        values = "  ".join(f"{k}={v}" for k, v in row["values"].items())
        score = row[metric]
        shown = f"{score:.3f}" if isinstance(score, (int, float)) else f"failed: {row['error']}"
        echo(f"trial {i}  {values}  {metric} {shown}  {row['output_dir'] or ''}")
    scored = [row for row in rows if isinstance(row[metric], (int, float)) and row[metric] == row[metric]]
    if scored:
        best = max(scored, key=lambda row: row[metric])
        echo(f"best: {best['values']}  {metric} {best[metric]:.3f}")
    else:
        echo("best: none (no trial reported a score)")
