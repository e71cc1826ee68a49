"""``spanrl demo``: the whole pipeline, locally, on a tiny model, in a few minutes on two CPU cores.

1. Build a tiny Llama (~667k parameters) and a word-level tokenizer (``demo/tiny.py``).
2. Start the careless demonstrator (an OpenAI-compatible server that swaps the operands of ``sub`` and
   ``div`` 70% of the time) and run the calculator agent (``spanrl.demo.calculator.agent``, a plain
   OpenAI-client program under ``opentelemetry-instrument``, as jsonl workers) against it; its traces go
   collector -> DuckDB -> transitions (retokenized from the recorded messages) -> SFT warm start.
3. GRPO from the agent's own traces through the policy server (exact token ids and log-probs).
4. Print held-out greedy success after SFT and after GRPO, write the reward curve PNG, leave the
   DuckDB file (``spans.duckdb``) for SQL.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from spanrl.errors import ConfigError, positive_number

__all__ = ["DemoConfig", "DemoResult", "run_demo"]

_DEMO_FILES = ("sft", "grpo", "demo_result.json")  # an earlier demo's, beside the run files of trainer/run_folder.py
AGENT_MODULE = "spanrl.demo.calculator.agent"
"""The demo's agent, run as ``python -m AGENT_MODULE`` (it ships in the package: the demo runs from a wheel)."""


@dataclasses.dataclass
class DemoConfig:
    """The demo's budget. Defaults fit in about five minutes on two cores."""

    output_dir: str = "spanrl-demo"
    """Everything goes here: model, checkpoints, spans.duckdb, reward_curve.png."""
    n_train_tasks: int = 3000
    """Training tasks (the held-out ones are never among them)."""
    n_val_tasks: int = 100
    """Held-out tasks, balanced over the operations; evaluated greedily."""
    ops: tuple[str, ...] = ("add", "sub", "mul", "div")
    """Operations the tasks use (a subset makes a smaller, faster demo, e.g. ``("sub",)``)."""
    demonstrations: int = 800
    """Demonstrator rollouts recorded for the SFT warm start."""
    sft_epochs: int = 4
    """SFT passes over the demonstrations (800 x 4 / 32 = 100 optimizer steps). More epochs make the
    policy confidently wrong on sub/div (it memorises), which leaves GRPO few right samples to learn from."""
    sft_batch_size: int = 32
    """Transitions per SFT optimizer step."""
    sft_learning_rate: float = 1e-3
    """SFT learning rate."""
    grpo_steps: int = 30
    """GRPO updates (held-out after 30, measured from 0.54 after SFT: 0.81-0.97, median 0.94, in 6 runs)."""
    grpo_tasks_per_step: int = 16
    """Tasks per GRPO step."""
    grpo_group_size: int = 8
    """Rollouts per task (the GRPO group)."""
    grpo_learning_rate: float = 5e-4
    """GRPO learning rate (1e-3 collapsed a weak start in measurements)."""
    grpo_iterations: int = 2
    """Passes of each GRPO update over its step's rollouts (TRL's ``num_iterations``; the second pass is
    clipped against the sampling policy). With 1, two runs of four stalled (0.54 -> 0.61 and 0.64 after 30 steps)."""
    eval_every: int = 10
    """Held-out evaluation every this many GRPO steps (points on the curve)."""
    workers: int = 4
    """Long-lived agent worker processes."""
    torch_threads: int = 1
    """Torch threads of the training process (on two cores, agents and server need the other)."""
    update_threads: int = 2
    """Torch threads of each update: the step's rollouts have ended by then, so it has both cores."""
    seed: int = 0
    """Seeds the tasks, the model, the demonstrator and training: the SFT start is the same in every run of
    one seed; GRPO's sampling through the policy server is not."""
    progress: bool = True
    """Rich progress bars."""
    rollouts: Any = None
    """Where the agent's rollouts run (a ``RolloutsConfig`` or its mapping, e.g. ``{"backend": "ray"}``);
    None: on this machine."""
    serving: Any = None
    """Where GRPO's policy server runs (a ``ServingConfig`` or its mapping, e.g. ``{"placement": "local"}``: in the
    trainer's process). None: ``{"placement": "process"}``, a ``spanrl serve`` subprocess off the trainer's
    interpreter lock (it paced the steps: docs/measurements.md), when the rollouts run on this machine."""
    overwrite: bool = False
    """Run again in an output_dir holding an earlier demo, removing it first (without it such a folder is refused)."""

    @classmethod
    def quick(cls, **fields: Any) -> DemoConfig:
        """The shortest setting that still runs every stage (about a minute): a smoke test, not a result."""
        small = dict(n_train_tasks=64, n_val_tasks=8, demonstrations=32, sft_epochs=1, grpo_steps=2,
                     grpo_tasks_per_step=2, grpo_group_size=4, eval_every=0, workers=2,
                     serving={"placement": "local"})  # 2 steps: a server process's start (~4 CPU-s) would outweigh
        return cls(**{**small, **fields})

    def validate(self) -> DemoConfig:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            least = 0 if field.name in ("seed", "eval_every") else 1
            if field.type == "int" and (not isinstance(value, int) or value < least):
                raise ConfigError(f"{field.name} must be an integer >= {least}, got {value!r}")
        for name in ("sft_learning_rate", "grpo_learning_rate"):
            positive_number(name, getattr(self, name))
        if self.n_train_tasks + self.n_val_tasks > 9950:
            raise ConfigError(
                f"n_train_tasks + n_val_tasks must be at most 9950, got {self.n_train_tasks + self.n_val_tasks}"
            )
        return self


@dataclasses.dataclass
class DemoResult:
    """What the demo measured and where it left things."""

    sft_success: float
    """Held-out greedy success after the SFT warm start."""
    grpo_success: float
    """Held-out greedy success after GRPO."""
    demonstrator_success: float
    """Share of the demonstrations that earned reward 1."""
    seconds: float
    output_dir: Path
    db_path: Path
    curve_path: Path
    history: list[dict[str, Any]]


def run_demo(config: DemoConfig | None = None, *, echo: Any = print) -> DemoResult:
    """Run the demo; ``echo`` prints the narration (``print`` by default)."""
    from spanrl.demo.calculator import tasks as calculator
    from spanrl.demo.calculator.demonstrator import DemonstratorServer
    from spanrl.trainer.config import CURVE_FILE, DB_FILE
    from spanrl.trainer.plotting import plot_reward_curve
    from spanrl.demo.tiny import build_tiny_model
    from spanrl.trainer.run_folder import claim_output_dir

    cfg = (config or DemoConfig()).validate()
    started = time.perf_counter()
    out = Path(cfg.output_dir)
    claim_output_dir(out, resume=False, overwrite=cfg.overwrite, markers=_DEMO_FILES, also=("model",),
                     can_resume=False)
    out.mkdir(parents=True, exist_ok=True)
    train_tasks, val_tasks = calculator.split_tasks(cfg.n_train_tasks, cfg.n_val_tasks, seed=cfg.seed,
                                                    ops=tuple(cfg.ops))

    echo(f"[1/4] building a tiny Llama + word tokenizer in {out / 'model'}")
    model_dir = build_tiny_model(out / "model", words=calculator.vocabulary(), seed=cfg.seed)

    echo(f"[2/4] SFT warm start on {cfg.demonstrations} traces of a careless demonstrator "
         f"(swaps sub/div operands {calculator.DEMO_ERROR_RATE:.0%} of the time)")
    with DemonstratorServer(seed=cfg.seed) as teacher:
        sft = _sft_trainer(cfg, teacher.url, model_dir, train_tasks, val_tasks)
        sft_history = sft.train()
    sft_success = float(sft_history[-1]["val_success"])
    demo_success = float(sft_history[-1].get("reward_mean") or 0.0)
    echo(f"      demonstrations earned reward {demo_success:.2f}; held-out success after SFT: {sft_success:.2f}")

    echo(f"[3/4] GRPO from the agent's own traces: {cfg.grpo_steps} steps x {cfg.grpo_tasks_per_step} tasks "
         f"x {cfg.grpo_group_size} rollouts, policy server -> spans -> DuckDB -> transitions")
    grpo_history = _grpo_trainer(cfg, sft.latest_checkpoint() or model_dir, train_tasks, val_tasks).train()
    grpo_success = float(grpo_history[-1]["val_success"])

    history = [{"step": 0, "val_success": sft_success}, *grpo_history]
    curve = plot_reward_curve(history, out / CURVE_FILE, title="spanrl demo: calculator agent, GRPO after SFT")
    (out / "demo_result.json").write_text(
        json.dumps({"sft_success": sft_success, "grpo_success": grpo_success, "demonstrator_success": demo_success},
                   indent=1)

    )
    seconds = time.perf_counter() - started
    db_path = out / DB_FILE
    echo(f"[4/4] held-out success (greedy, {len(val_tasks)} tasks): after SFT {sft_success:.2f} -> after GRPO "
         f"{grpo_success:.2f}   ({seconds:.0f} s)")
    echo(f"      reward curve: {curve}")
    echo(f"      spans: {db_path}  (try: spanrl sql --db {db_path} \"SELECT * FROM rollouts LIMIT 5\")")
    return DemoResult(
        sft_success=sft_success, grpo_success=grpo_success, demonstrator_success=demo_success, seconds=seconds,
        output_dir=out, db_path=db_path, curve_path=curve, history=history,
    )


_CACHED = {"prefix_caching": True}  # both stages' servers (SFT's evaluations too): docs/measurements.md
_PROCESS = {**_CACHED, "placement": "process"}


def _config(cfg: DemoConfig, stage: str, **fields: Any) -> Any:
    """The TrainerConfig of one stage (``sft`` or ``grpo``): both write to one span store."""
    from spanrl.trainer.config import DB_FILE, TrainerConfig
    from spanrl.rollouts.rollouts import RolloutsConfig
    from spanrl.rollouts.runner import RunnerConfig

    out = Path(cfg.output_dir)
    runner = RunnerConfig(workers=cfg.workers, max_concurrency=2 * cfg.workers, rollout_timeout_s=60.0)
    if "runner" in fields:
        runner = dataclasses.replace(runner, **fields.pop("runner"))
    return TrainerConfig(output_dir=str(out / stage), db_path=str(out / DB_FILE), eval_at_start=False, seed=cfg.seed,
                         progress=cfg.progress, torch_threads=cfg.torch_threads, update_threads=cfg.update_threads,
                         runner=runner, rollouts=RolloutsConfig.of(cfg.rollouts), **fields)


def _sft_trainer(cfg: DemoConfig, teacher_url: str, model: Path, train_tasks: list[Any], val_tasks: list[Any]) -> Any:
    """One SFT step over ``demonstrations`` rollouts of the agent against the demonstrator at ``teacher_url``."""
    from spanrl.algorithms.sft import SFT
    from spanrl.rollouts.policy_pool import ServingConfig
    from spanrl.trainer.trainer import Trainer

    algorithm = SFT(learning_rate=cfg.sft_learning_rate, epochs=cfg.sft_epochs, batch_size=cfg.sft_batch_size,
                    reward_threshold=None)  # imitate every demonstration, mistakes included
    config = _config(cfg, "sft", llm_url=teacher_url, n_rollouts=1, tasks_per_step=cfg.demonstrations, max_steps=1,
                     runner={"require_token_spans": False}, serving=ServingConfig.of(_CACHED))
    return Trainer(model=model, agent=[sys.executable, "-m", AGENT_MODULE], tasks=train_tasks, val_tasks=val_tasks,
                   algorithm=algorithm, config=config)


def _grpo_trainer(cfg: DemoConfig, model: Path, train_tasks: list[Any], val_tasks: list[Any]) -> Any:
    """GRPO on the agent's own rollouts through the policy server."""
    from spanrl.algorithms.credit import LightningRL
    from spanrl.algorithms.grpo import GRPO
    from spanrl.rollouts.policy_pool import ServingConfig
    from spanrl.trainer.trainer import Trainer

    config = _config(cfg, "grpo", n_rollouts=cfg.grpo_group_size, tasks_per_step=cfg.grpo_tasks_per_step,
                     max_steps=cfg.grpo_steps, temperature=1.0, eval_every=cfg.eval_every,
                     serving=ServingConfig.of(_PROCESS if cfg.serving is None and cfg.rollouts is None
                                              else cfg.serving))
    return Trainer(model=model, agent=[sys.executable, "-m", AGENT_MODULE], tasks=train_tasks, val_tasks=val_tasks,
                   algorithm=GRPO(learning_rate=cfg.grpo_learning_rate, num_iterations=cfg.grpo_iterations),
                   credit=LightningRL(mode="identical", baseline="grpo"), config=config)
