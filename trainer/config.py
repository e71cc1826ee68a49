"""The Trainer's knobs (:class:`TrainerConfig`), the names of the files it writes, and the checks of its arguments.

The algorithm and credit assignment have their own configs; ``docs/train-config.md`` documents every
key a ``spanrl train`` YAML may hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pathlib import Path

from spanrl.algorithms.checkpoint_folders import CHECKPOINT_PREFIX, TRAINER_STATE_FILE
from spanrl.trainer.reporting import check_report_to
from spanrl.errors import ConfigError, non_negative_int, positive_int, positive_number
from spanrl.rollouts.policy_pool import ServingConfig
from spanrl.rollouts.rollouts import RolloutsConfig
from spanrl.rollouts.runner import RunnerConfig

__all__ = [
    "APO_RESULT_FILE", "CHECKPOINT_PREFIX", "CONFIG_FILE", "CURVE_FILE", "DB_FILE", "HISTORY_FILE", "LOG_FILE",
    "ROLLOUTS_FILE", "SERVED_MODEL_NAME", "TRAINER_STATE_FILE", "TrainerConfig", "check_arguments",
    "run_description",
]

CONFIG_FILE = "config.json"
HISTORY_FILE = "history.jsonl"
ROLLOUTS_FILE = "rollouts.jsonl"
CURVE_FILE = "reward_curve.png"
APO_RESULT_FILE = "apo_result.json"
DB_FILE = "spans.duckdb"
LOG_FILE = "spanrl.log"
SERVED_MODEL_NAME = "policy"


@dataclasses.dataclass
class TrainerConfig:
    """The training loop's knobs (the algorithm and credit assignment have their own configs)."""

    output_dir: str = "spanrl-run"
    """Checkpoints, the span store, logs and the reward curve go here."""
    n_rollouts: int = 8
    """Rollouts per task per step (the GRPO group size)."""
    tasks_per_step: int = 8
    """Tasks sampled per step (with replacement across steps, without within one)."""
    max_steps: int = 50
    """Policy updates in total (a resumed run counts the steps already done)."""
    max_minutes: float | None = None
    """A time budget for ``train()``: the step under way when it runs out is the last (evaluated and saved as
    the ``max_steps``-th would be); None: no budget."""
    temperature: float = 1.0
    """Sampling temperature asked of the agent for training rollouts (evaluation is greedy: 0)."""
    max_tokens: int | None = None
    """Completion token limit asked of the agent; None leaves it to the agent."""
    updates_per_step: int = 1
    """Algorithm updates per step over the step's transitions (e.g. SFT epochs over demonstrations)."""
    minibatch_size: int | None = None
    """Transitions per update, sampled from the step's; None = all of them."""
    eval_every: int = 0
    """Evaluate on val_tasks every this many steps (0 = only at start and end)."""
    eval_at_start: bool = True
    """Evaluate before the first update (the baseline the curve starts from)."""
    save_every: int = 0
    """Checkpoint every this many steps (0 = only at the end)."""
    seed: int = 0
    """The run's one seed: task sampling, minibatches, the algorithm, and each rollout's sampling seed
    (``spanrl.seeding``); printed when the run starts. See docs/train-config.md, "Reproducible runs"."""
    deterministic: bool = False
    """Also pin what costs speed: torch's deterministic algorithms, and an embedded server that generates one
    request at a time (a batch's neighbours change a row's logits in the last bits). Same seed and config:
    bit-identical weights on one machine, whatever its load (synchronous runs, the embedded server)."""
    report_to: tuple[str, ...] = ("none",)
    """``tensorboard`` (``output_dir/runs``), ``wandb``, or ``none``."""
    resume: bool = False
    """Continue from the newest ``checkpoint-<step>`` in output_dir."""
    overwrite: bool = False
    """Start over in an output_dir that holds an earlier run, removing that run's files first (without
    ``resume`` or ``overwrite`` such a folder is refused: ``trainer/run_folder.py``)."""
    progress: bool = True
    """Show rich progress bars for rollouts and steps."""
    llm_url: str | None = None
    """Rollouts talk to this OpenAI-compatible root URL (e.g. a teacher, for SFT data) instead of the
    embedded policy server; the server still runs (for evaluation and deploy)."""
    db_path: str | None = None
    """The span store; default ``output_dir/spans.duckdb``."""
    agent_name: str | None = None
    """Train only this agent's LLM calls (``gen_ai.agent.name``) in a multi-agent system."""
    server_max_batch_size: int = 32
    """Generation requests the embedded policy server batches together."""
    torch_threads: int | None = None
    """``torch.set_num_threads`` for this process (training and the embedded server); None leaves it.
    On a few shared cores 1 is much faster: agents, collector and server compete with torch's threads."""
    update_threads: int | None = None
    """Torch threads while the policy updates; None: ``torch_threads``. A synchronous step's rollouts have
    ended before its update starts, so the update may use every core (the demo's 2: its GRPO update's median
    0.39 -> 0.25 s); refused with ``async_steps``, whose rollouts run beside the update."""
    async_steps: bool = False
    """Run the next step's rollouts while the current update computes (on a background thread); each
    update then learns from rollouts of a policy up to ``max_staleness`` updates old (GRPO's clipped
    ratio corrects with the recorded log-probs). False: every step waits for its own rollouts."""
    max_staleness: int = 1
    """With ``async_steps``: rollouts start at most this many steps ahead, so they lag the policy they
    update by at most this many versions."""
    max_bad_updates: int = 3
    """Stop with a `TrainingError` after this many updates in a row whose loss or gradient norm was not
    finite (GRPO and PPO skip such optimizer steps, so the weights and the last checkpoint stay good)."""
    runner: RunnerConfig = dataclasses.field(default_factory=RunnerConfig)
    """How rollouts run: concurrency, timeouts, retries, command workers."""
    serving: ServingConfig = dataclasses.field(default_factory=ServingConfig)
    """Backend, device and dtype of the embedded server, and servers it did not start (``urls``);
    a mapping of ServingConfig fields is accepted (the YAML's ``serving:``)."""
    rollouts: RolloutsConfig = dataclasses.field(default_factory=RolloutsConfig)
    """Where rollouts run: here, or on a Ray cluster (``backend: ray``); a mapping of RolloutsConfig
    fields is accepted (the YAML's ``rollouts:``)."""

    def validate(self) -> TrainerConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        for name in ("n_rollouts", "tasks_per_step", "max_steps", "updates_per_step", "server_max_batch_size",
                     "max_bad_updates"):
            positive_int(name, getattr(self, name))
        for name in ("eval_every", "save_every"):
            non_negative_int(name, getattr(self, name))
        for name in ("async_steps", "deterministic"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        positive_int("max_staleness", self.max_staleness)
        for name in ("torch_threads", "update_threads", "minibatch_size", "max_tokens"):
            positive_int(name, getattr(self, name), optional=True)
        if self.update_threads is not None and self.async_steps:
            raise ConfigError("update_threads: with async_steps the next step's rollouts run beside the update and "
                              "need those cores; leave update_threads unset (torch_threads applies)")
        if self.max_minutes is not None and (not isinstance(self.max_minutes, (int, float))
                                             or isinstance(self.max_minutes, bool) or not self.max_minutes > 0):
            raise ConfigError(f"max_minutes must be a positive number of minutes or None, got {self.max_minutes!r}")
        positive_number("temperature", self.temperature, allow_zero=True)
        report_to = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        check_report_to(report_to)
        self.report_to = tuple(report_to)
        self.runner.validate()
        self.serving = ServingConfig.of(self.serving)
        self.rollouts = RolloutsConfig.of(self.rollouts)
        return self


def check_arguments(
    cfg: TrainerConfig, model: str | Path, tasks: Sequence[Any], algorithm: Any, prompt_template: str | None
) -> bool:
    """Refuse what cannot train (naming the argument); True when ``algorithm`` optimises the prompt (APO)."""
    if not Path(model).is_dir():
        raise ConfigError(f"model must be a Hugging Face model folder, got {str(model)!r} (not a directory)")
    if not tasks:
        raise ConfigError("tasks must hold at least one task")
    if cfg.tasks_per_step > len(tasks):
        raise ConfigError(f"tasks_per_step ({cfg.tasks_per_step}) is larger than the number of tasks ({len(tasks)})")
    optimizes_prompt = (callable(getattr(algorithm, "optimize", None))
                        and not callable(getattr(algorithm, "update", None)))
    if prompt_template is not None and not isinstance(prompt_template, str):
        raise ConfigError(f"prompt_template must be a string, got {type(prompt_template).__name__}")
    if optimizes_prompt:
        if not prompt_template:
            raise ConfigError("prompt_template must be the initial template when the algorithm is APO, got None")
        if cfg.resume:
            raise ConfigError("resume must be False with APO: prompt optimisation keeps no checkpoints")
    else:
        for name in ("setup", "update", "save", "load_state", "load_batch", "push_weights"):
            if not callable(getattr(algorithm, name, None)):
                raise ConfigError(
                    f"algorithm must be an Algorithm (GRPO(...), SFT(...), APO(...), ...); it has no {name}() "
                    "(spanrl.algorithms.base.Algorithm gives the defaults of the optional ones)"
                )
    if cfg.agent_name and callable(getattr(algorithm, "rollout_models", None)):
        raise ConfigError(f"agent_name {cfg.agent_name!r} trains one agent; with policies each agent trains its own "
                          "adapter: give one or the other")
    algo_temperature = getattr(getattr(algorithm, "config", None), "temperature", None)
    if isinstance(algo_temperature, (int, float)) and cfg.temperature > 0 and algo_temperature != cfg.temperature:
        raise ConfigError(
            f"temperature {cfg.temperature!r} (the rollouts') differs from the algorithm's temperature "
            f"{algo_temperature!r} (what its log-probs divide the logits by); set both to the same value"
        )
    return optimizes_prompt


def run_description(trainer: Any) -> dict[str, Any]:
    """What ``config.json`` and each checkpoint's trainer state record about a Trainer's run."""
    algo_cfg = getattr(trainer.algorithm, "config", None)
    agent = trainer.agent
    return {
        "trainer": dataclasses.asdict(trainer.config),
        "model": str(trainer.model_path),
        "agent": agent if isinstance(agent, (str, list, tuple)) else getattr(agent, "__qualname__", repr(agent)),
        "algorithm": {
            "name": type(trainer.algorithm).__name__,
            **(dataclasses.asdict(algo_cfg) if dataclasses.is_dataclass(algo_cfg) else {}),
        },
        "credit": (
            dataclasses.asdict(trainer.credit) if dataclasses.is_dataclass(trainer.credit) else repr(trainer.credit)
        ),

        "prompt_template": trainer.prompt_template,
        "n_tasks": len(trainer.tasks),
        "n_val_tasks": len(trainer.val_tasks),
    }
