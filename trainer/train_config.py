"""The ``spanrl train`` config: a YAML (or JSON) mapping -> a :class:`~spanrl.trainer.trainer.Trainer`.

Every key, its default and its meaning: ``docs/train-config.md``. In short::

    model: tiny-model/                # a Hugging Face folder, or {tiny: {...}} to build a tiny one
    agent: [python, agent.py]         # a command line (run under opentelemetry-instrument), or
                                      # {callable: module:fn}, or {env_class: m:Env, reward_class: m:Reward}
    tasks: tasks.jsonl                # a JSONL/JSON file, or an inline list
    task_defaults: {max_tries: 1}     # fields added to every task that lacks them
    val_tasks: val.jsonl              # optional
    algorithm: {name: grpo, learning_rate: 5.0e-4}   # grpo | ppo | sft | dpo | apo, fields by name
    credit: {mode: identical, baseline: grpo}        # LightningRL fields
    prompt_template: "Solve: {question}"             # given to every agent; APO's starting template
    policies: {writer: {lora: {r: 8}}, checker: {}}  # one LoRA adapter per agent, trained together (optional)
    n_rollouts: 8                     # any TrainerConfig field
    runner: {workers: 4, rollout_timeout_s: 60}      # any RunnerConfig field
    rollouts: {backend: ray, address: auto}          # where rollouts run (RolloutsConfig fields)

Paths of files the config names (tasks, model, ``words_file``) are relative to the config's folder;
``output_dir`` is relative to the current folder, as on the command line. In ``agent``, a word naming a
file next to the config is made absolute and a leading ``python`` is the Python running spanrl, so the
config runs from any folder.
An unknown key is an error naming the nearest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import shlex
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError, UsageError

__all__ = ["TOP_LEVEL_KEYS", "TINY_KEYS", "agent_command", "build_trainer", "load_tasks", "read_config"]

DOCS = "docs/train-config.md"
TOP_LEVEL_KEYS = ("model", "agent", "tasks", "val_tasks", "task_defaults", "algorithm", "credit", "prompt_template",
                  "runner", "serving", "rollouts", "policies")
TINY_KEYS = ("words", "words_file", "words_from_tasks", "hidden_size", "num_layers", "num_heads", "intermediate_size",
             "seed", "max_position_embeddings")
_TINY_FOLDER = "model"
_TASK_FORMATS = (".jsonl", ".json")


def check_keys(raw: Mapping[str, Any], valid: Iterable[str], *, section: str = "", kind: str = "a trainer",
               docs: str = DOCS) -> None:
    """Refuse a key not in ``valid``, naming it, the nearest valid key and ``docs``; ``kind`` names a top-level
    key's config (``an online trainer``)."""
    valid = sorted(valid)
    for key in raw:
        if key in valid:
            continue
        near = difflib.get_close_matches(str(key), valid, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        name = f"{section}.{key}" if section else repr(key)
        kinds = {"": kind, "runner": "a runner", "credit": "a credit", "model.tiny": "a tiny model",
                 "algorithm": "an algorithm", "algorithm.lora": "a LoRA", "serving": "a serving",
                 "rollouts": "a rollouts"}
        raise ConfigError(f"{name} is not {kinds.get(section, f'a {section}')} setting{hint} (valid: "
                          f"{', '.join(valid)}; see {docs})")


def read_config(path: Path) -> dict[str, Any]:
    """The mapping a YAML (or JSON) config file holds; a syntax error is one line naming file:line:column."""
    import yaml

    if not path.is_file():
        raise ConfigError(f"config: no such file {str(path)!r}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        raise UsageError(f"config: {where}: not valid YAML: {problem}" + (f" ({context})" if context else "")
                         + "; fix that line (a value holding ': ' or ' #' needs quotes)") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config: {path} must hold a mapping of settings, got {type(raw).__name__}")
    return raw


def load_tasks(value: Any, base: Path, field: str) -> list[Any]:
    """Tasks from an inline list or a ``.jsonl`` / ``.json`` file (relative to ``base``)."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{field} must be a list of tasks or a .jsonl/.json file path, got {type(value).__name__}")
    path = (base / value) if not Path(value).is_absolute() else Path(value)
    if not path.is_file():
        raise ConfigError(f"{field}: no such file {str(path)!r}")
    if path.suffix not in _TASK_FORMATS:
        raise UsageError(f"{field}: {str(path)!r} is a {path.suffix or 'suffix-less'} file; tasks come as .jsonl (one "
                         "JSON object a line), .json (a JSON list) or a list in the config itself")
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
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{field}: {path} is not JSON ({exc})") from None
    if not isinstance(loaded, list):
        raise ConfigError(f"{field}: {path} must hold a JSON list of tasks")
    return loaded


def build_trainer(raw: dict[str, Any], *, base: Path = Path(".")) -> Any:
    """A :class:`Trainer` from a parsed config dict (see the module docstring)."""
    from spanrl.algorithms import algorithm_class
    from spanrl.algorithms.credit import CreditConfig
    from spanrl.algorithms.presets import trainer_credit
    from spanrl.rollouts.policy_pool import ServingConfig
    from spanrl.rollouts.rollouts import RolloutsConfig
    from spanrl.rollouts.runner import RunnerConfig
    from spanrl.trainer.trainer import Trainer, TrainerConfig

    if not isinstance(raw, dict):
        raise ConfigError("the train config must be a mapping of settings")
    raw = dict(raw)
    for key in ("model", "agent", "tasks"):
        if key not in raw:
            raise ConfigError(f"the train config needs {key!r}")
    trainer_fields = {f.name for f in dataclasses.fields(TrainerConfig)} - {"runner", "serving", "rollouts"}
    check_keys(raw, trainer_fields | set(TOP_LEVEL_KEYS))
    algo_raw = dict(raw.pop("algorithm", None) or {"name": "grpo"})
    cls = algorithm_class(str(algo_raw.pop("name", "grpo")), field="algorithm.name")
    check_keys(algo_raw, {f.name for f in dataclasses.fields(cls.config_class)}, section="algorithm")
    if isinstance(algo_raw.get("lora"), Mapping):
        from spanrl.algorithms.lora import LoRAConfig

        check_keys(algo_raw["lora"], {f.name for f in dataclasses.fields(LoRAConfig)}, section="algorithm.lora")
        algo_raw["lora"] = LoRAConfig(**algo_raw["lora"])
    credit_raw = raw.pop("credit", None) or {}
    check_keys(credit_raw, {f.name for f in dataclasses.fields(CreditConfig)}, section="credit")
    runner_raw = raw.pop("runner", None) or {}
    check_keys(runner_raw, {f.name for f in dataclasses.fields(RunnerConfig)}, section="runner")
    serving_raw = raw.pop("serving", None) or {}
    check_keys(serving_raw, {f.name for f in dataclasses.fields(ServingConfig)}, section="serving")
    rollouts_raw = raw.pop("rollouts", None) or {}
    check_keys(rollouts_raw, {f.name for f in dataclasses.fields(RolloutsConfig)}, section="rollouts")
    defaults = raw.pop("task_defaults", None) or {}
    if not isinstance(defaults, Mapping):
        raise ConfigError(f"task_defaults must be a mapping of task fields, got {type(defaults).__name__}")
    tasks = _with_defaults(load_tasks(raw.pop("tasks"), base, "tasks"), defaults)
    val_tasks = (
        _with_defaults(load_tasks(raw.pop("val_tasks"), base, "val_tasks"), defaults) if raw.get("val_tasks") else None
    )
    raw.pop("val_tasks", None)
    model, agent, prompt_template = raw.pop("model"), raw.pop("agent"), raw.pop("prompt_template", None)
    policies = raw.pop("policies", None)
    if policies is not None and not isinstance(policies, Mapping):
        raise ConfigError(f"policies must map agent names to policy settings, got {type(policies).__name__}")
    if isinstance(raw.get("report_to"), list):
        raw["report_to"] = tuple(raw["report_to"])
    config = TrainerConfig(**raw, runner=RunnerConfig(**runner_raw), serving=ServingConfig.of(serving_raw),
                           rollouts=RolloutsConfig.of(rollouts_raw))
    from spanrl.trainer.run_folder import claim_output_dir

    # before the tiny model is built there: a new run must not reuse the old run's (its words may differ)
    claim_output_dir(Path(config.output_dir), resume=config.resume, overwrite=config.overwrite,
                     also=[_TINY_FOLDER] if isinstance(model, Mapping) else [])
    algorithm = cls(**algo_raw)
    return Trainer(
        model=_model(model, base, Path(config.output_dir), [*tasks, *(val_tasks or [])]),
        agent=agent_command(agent, base), tasks=tasks, val_tasks=val_tasks, algorithm=algorithm,
        credit=trainer_credit(getattr(algorithm, "config", None), credit_raw),  # the preset fills what it couples
        prompt_template=prompt_template, config=config,
        policies=dict(policies) if policies else None,
    )


def _with_defaults(tasks: list[Any], defaults: Mapping[str, Any]) -> list[Any]:
    """``defaults`` under each mapping task's own fields (a task's field wins)."""
    return [{**defaults, **task} if defaults and isinstance(task, Mapping) else task for task in tasks]


def agent_command(value: Any, base: Path) -> Any:
    """The agent: a command with files next to the config made absolute and ``python`` this Python;
    or ``{callable: module:name}``; or ``{env_class: module:Env, reward_class: module:Reward}`` (the
    quick-start API's environment played as a callable agent). Modules next to the config import."""
    if isinstance(value, Mapping):
        if set(value) == {"callable"}:
            return _import_ref(value["callable"], base, "agent.callable")
        if set(value) == {"env_class", "reward_class"}:
            from spanrl.quickstart import env_agent

            return env_agent(_import_ref(value["env_class"], base, "agent.env_class"),
                             _import_ref(value["reward_class"], base, "agent.reward_class"))
        raise ConfigError("agent must be a command line, {callable: module:name} or "
                          f"{{env_class: ..., reward_class: ...}}, got the keys {sorted(value)}")

    if not isinstance(value, (str, list)):
        raise ConfigError(f"agent must be a command line (a string or a list of words), got {type(value).__name__}")
    words = shlex.split(value) if isinstance(value, str) else [str(w) for w in value]
    if not words:
        raise ConfigError("agent must be a command line, got an empty one")
    if words[0] in ("python", "python3"):
        words[0] = sys.executable
    return [str(base / w) if not Path(w).is_absolute() and (base / w).is_file() else w for w in words]


def _import_ref(ref: Any, base: Path, field: str) -> Any:
    """``module:name`` -> the object; the config's folder is searched first for the module."""
    import importlib

    module_name, _, name = str(ref).partition(":")
    if not module_name or not name:
        raise ConfigError(f"{field} must be 'module:name', got {ref!r}")
    if str(base.resolve()) not in sys.path:
        sys.path.insert(0, str(base.resolve()))
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{field}: cannot import {ref!r} ({exc})") from None


def _model(value: Any, base: Path, output_dir: Path, tasks: list[Any]) -> Path:
    """A model folder: a path (relative to the config) or ``{tiny: {...}}``, built into
    ``output_dir/model`` the first time and reused after."""
    if isinstance(value, str):
        return Path(value) if Path(value).is_absolute() else base / value
    if not isinstance(value, Mapping) or set(value) != {"tiny"}:
        raise ConfigError(f"model must be a model folder path or {{tiny: {{...}}}}, got {value!r}")
    spec = dict(value["tiny"] or {})
    check_keys(spec, TINY_KEYS, section="model.tiny")
    folder = output_dir / _TINY_FOLDER
    if (folder / "config.json").is_file():
        return folder
    from spanrl.demo.tiny import build_tiny_model

    words = set(str(w) for w in spec.pop("words", None) or [])
    words_file = spec.pop("words_file", None)
    if words_file:
        path = base / str(words_file)
        if not path.is_file():
            raise ConfigError(f"model.tiny.words_file: no such file {str(path)!r}")
        words.update(path.read_text().split())
    if spec.pop("words_from_tasks", False):
        words.update(w for task in tasks for w in _task_words(task))
    if not words:
        raise ConfigError("model.tiny needs words: set words, words_file or words_from_tasks")
    return build_tiny_model(folder, words=sorted(words), **spec)


def _task_words(task: Any) -> list[str]:
    """Whitespace-separated words of a task's string values (its ``id`` excepted)."""
    if isinstance(task, Mapping):
        return [w for k, v in task.items() if k != "id" for w in _task_words(v)]
    if isinstance(task, list):
        return [w for v in task for w in _task_words(v)]
    return task.split() if isinstance(task, str) else []
