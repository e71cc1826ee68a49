"""``spanrl train CONFIG.yaml`` and ``spanrl demo``. Handlers import the heavy modules lazily.

A train config (YAML or JSON) has the Trainer's knobs::

    model: tiny-model/                # a Hugging Face folder
    agent: python examples/calculator/agent.py    # a command line (run under opentelemetry-instrument)
    tasks: tasks.jsonl                # a JSONL/JSON file, or an inline list
    val_tasks: val.jsonl              # optional
    algorithm: {name: grpo, learning_rate: 5.0e-4}   # grpo | ppo | sft | dpo | apo, fields by name
    credit: {mode: identical, baseline: grpo}        # LightningRL fields
    prompt_template: "Solve: {question}"             # given to every agent; APO's starting template
    n_rollouts: 8                     # any TrainerConfig field
    runner: {workers: 4, rollout_timeout_s: 60}      # any RunnerConfig field
    serving: {backend: transformers, device: cpu, urls: [http://gpu1:8000], collector_port: 4399}  # ServingConfig
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError

_ALGORITHMS = {"grpo": "GRPO", "ppo": "PPO", "sft": "SFT", "dpo": "DPO", "apo": "APO"}
_TOP_LEVEL = ("model", "agent", "tasks", "val_tasks", "algorithm", "credit", "prompt_template")


def register(subparsers: Any) -> None:
    train = subparsers.add_parser("train", help="the training loop, from a YAML config")
    train.add_argument("config", help="YAML or JSON file with the Trainer's settings")
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in output_dir")
    train.add_argument("--output-dir", help="override output_dir")
    train.add_argument("--max-steps", type=int, help="override max_steps")
    train.set_defaults(func=_train)

    demo = subparsers.add_parser("demo", help="everything, locally, on a tiny model (about 5 minutes)")
    demo.add_argument("--output-dir", default="spanrl-demo", help="where everything goes (default spanrl-demo)")
    demo.add_argument("--grpo-steps", type=int, help="GRPO updates (default from DemoConfig)")
    demo.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    demo.set_defaults(func=_demo)


def _load_tasks(value: Any, base: Path, field: str) -> list[Any]:
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{field} must be a list of tasks or a .jsonl/.json file path, got {type(value).__name__}")
    path = (base / value) if not Path(value).is_absolute() else Path(value)
    if not path.is_file():
        raise ConfigError(f"{field}: no such file {str(path)!r}")
    text = path.read_text()
    if path.suffix == ".jsonl":
        tasks = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    tasks.append(json.loads(line))
                except ValueError as exc:
                    raise ConfigError(f"{field}: {path}:{number} is not JSON ({exc})") from None
        return tasks
    loaded = json.loads(text)
    if not isinstance(loaded, list):
        raise ConfigError(f"{field}: {path} must hold a JSON list of tasks")
    return loaded


def build_trainer(raw: dict[str, Any], *, base: Path = Path(".")) -> Any:
    """A :class:`Trainer` from a parsed config dict (see the module docstring)."""
    import spanrl.algorithms as algorithms
    from spanrl.trainer.runner import RunnerConfig
    from spanrl.algorithms.credit import LightningRL
    from spanrl.trainer.trainer import Trainer, TrainerConfig

    if not isinstance(raw, dict):
        raise ConfigError("the train config must be a mapping of settings")
    raw = dict(raw)
    for key in ("model", "agent", "tasks"):
        if key not in raw:
            raise ConfigError(f"the train config needs {key!r}")
    algo_raw = dict(raw.pop("algorithm", None) or {"name": "grpo"})
    name = str(algo_raw.pop("name", "grpo")).lower()
    if name not in _ALGORITHMS:
        raise ConfigError(f"algorithm.name must be one of {sorted(_ALGORITHMS)}, got {name!r}")
    algorithm = getattr(algorithms, _ALGORITHMS[name])(**algo_raw)
    credit = LightningRL(**(raw.pop("credit", None) or {}))
    runner_fields = {f.name for f in dataclasses.fields(RunnerConfig)}
    runner_raw = raw.pop("runner", None) or {}
    for key in runner_raw:
        if key not in runner_fields:
            raise ConfigError(f"runner.{key} is not a runner setting; expected one of {sorted(runner_fields)}")
    trainer_fields = {f.name for f in dataclasses.fields(TrainerConfig)} - {"runner"}
    model, agent, prompt_template = raw.pop("model"), raw.pop("agent"), raw.pop("prompt_template", None)
    tasks = _load_tasks(raw.pop("tasks"), base, "tasks")
    val_tasks = _load_tasks(raw.pop("val_tasks"), base, "val_tasks") if raw.get("val_tasks") else None
    raw.pop("val_tasks", None)
    for key in raw:
        if key not in trainer_fields:
            raise ConfigError(f"{key!r} is not a trainer setting; expected one of {sorted(trainer_fields | set(_TOP_LEVEL))}")
    if isinstance(raw.get("report_to"), list):
        raw["report_to"] = tuple(raw["report_to"])
    config = TrainerConfig(**raw, runner=RunnerConfig(**runner_raw))
    model_path = Path(model) if Path(model).is_absolute() else base / model
    return Trainer(
        model=model_path, agent=agent, tasks=tasks, val_tasks=val_tasks, algorithm=algorithm, credit=credit,
        prompt_template=prompt_template, config=config,
    )


def _train(args: argparse.Namespace) -> int:
    import yaml

    path = Path(args.config)
    if not path.is_file():
        raise ConfigError(f"config: no such file {str(path)!r}")
    raw = yaml.safe_load(path.read_text()) or {}
    if args.resume:
        raw["resume"] = True
    if args.output_dir:
        raw["output_dir"] = args.output_dir
    if args.max_steps is not None:
        raw["max_steps"] = args.max_steps
    trainer = build_trainer(raw, base=path.parent)
    history = trainer.train()
    last = history[-1] if history else {}
    print(json.dumps({"step": trainer.step, "output_dir": str(trainer.output_dir), **{k: last[k] for k in ("reward_mean", "val_success", "apo/best_score", "prompt_template") if k in last}}))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from spanrl.trainer.demo import DemoConfig, run_demo

    config = DemoConfig(output_dir=args.output_dir, seed=args.seed, progress=not args.no_progress)
    if args.grpo_steps is not None:
        config.grpo_steps = args.grpo_steps
    run_demo(config)
    return 0
