"""The Trainer: rollouts -> spans -> transitions -> credit -> update -> reload, in a loop.

    trainer = spanrl.Trainer(
        model="tiny-model/",                  # a Hugging Face folder
        agent="python agent.py",              # or a callable agent(task, llm), sync or async
        tasks=train_tasks, val_tasks=val_tasks,
        algorithm=GRPO(learning_rate=5e-4), credit=LightningRL(baseline="grpo"),
        n_rollouts=8, output_dir="run/",
    )
    trainer.train()
    client = trainer.deploy()                 # an openai.OpenAI client on the trained model

Prompt optimisation instead of weight updates: ``Trainer(algorithm=APO(critic_base_url=...),
prompt_template="Solve: {question}", ...)``; ``train()`` runs ``APO.optimize`` with a score that runs
``n_rollouts`` rollouts of the same ``tasks_per_step`` tasks (sampled once) with each candidate template
(mean final reward, a failed rollout counting 0), writes ``apo_result.json`` and keeps the best template
in ``trainer.prompt_template`` for later rollouts. The template reaches the agent as ``llm.prompt_template``
(callable agents) or ``SPANRL_PROMPT_TEMPLATE`` (commands); any Trainer can pass a fixed one.

Embedded: the Trainer starts the collector (DuckDB at ``output_dir/spans.duckdb``) and the policy
server itself. Each step samples ``tasks_per_step`` tasks, runs ``n_rollouts`` rollouts of each through
the :class:`~spanrl.trainer.runner.RolloutRunner` (bounded, retried, waited for until their spans are
committed), decomposes them with ``load_transitions`` (credit assignment included), updates the policy,
pushes the weights into the server (in process) and logs. Failed rollouts are recorded in
``output_dir/rollouts.jsonl`` and excluded; they never stop training.

Output: ``checkpoint-<step>/`` (HF folder + optimizer/RNG state + ``trainer_state.json``),
``config.json`` (resolved), ``history.jsonl``, ``reward_curve.png``, ``runs/`` (TensorBoard).
``resume=True`` continues from the newest checkpoint: same step count, history and task sequence.

Many processes (``accelerate launch --num_processes N train.py``, GRPO): rank 0 does everything above;
the other ranks only set the algorithm up and, each update, receive rank 0's transitions (broadcast),
update on their shard and average gradients, so every rank holds the same weights. ``train()`` returns
the history on rank 0 and an empty list elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from spanrl.algorithms import distributed as _distributed
from spanrl.trainer.policy_pool import PolicyPool, ServingConfig
from spanrl.trainer.reporting import NoProgress, Reporter
from spanrl.trainer.tracing import InProcessTracing
from spanrl.trainer.runner import RolloutJob, RolloutResult, RolloutRunner, RunnerConfig
from spanrl.algorithms.credit import LightningRL
from spanrl.errors import ConfigError, TrainingError
from spanrl import semconv

__all__ = ["Trainer", "TrainerConfig"]

_logger = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint-"
TRAINER_STATE_FILE = "trainer_state.json"
CONFIG_FILE = "config.json"
HISTORY_FILE = "history.jsonl"
ROLLOUTS_FILE = "rollouts.jsonl"
CURVE_FILE = "reward_curve.png"
APO_RESULT_FILE = "apo_result.json"
DB_FILE = "spans.duckdb"
SERVED_MODEL_NAME = "policy"
_REPORTERS = ("none", "tensorboard", "wandb")
_STEP_SEED_STRIDE = 1_000_003  # per-step task sampling seed = seed * stride + step (resumable, no RNG state)


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
    """Seeds task sampling, the algorithm and the server's sampler."""
    report_to: tuple[str, ...] = ("none",)
    """``tensorboard`` (``output_dir/runs``), ``wandb``, or ``none``."""
    resume: bool = False
    """Continue from the newest ``checkpoint-<step>`` in output_dir."""
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
    runner: RunnerConfig = dataclasses.field(default_factory=RunnerConfig)
    """How rollouts run: concurrency, timeouts, retries, command workers."""
    serving: ServingConfig = dataclasses.field(default_factory=ServingConfig)
    """Backend, device and dtype of the embedded server, and servers it did not start (``urls``);
    a mapping of ServingConfig fields is accepted (the YAML's ``serving:``)."""

    def validate(self) -> TrainerConfig:
        """Raise :class:`ConfigError` naming the first bad field; return self."""
        for name in ("n_rollouts", "tasks_per_step", "max_steps", "updates_per_step", "server_max_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("eval_every", "save_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")
        if self.torch_threads is not None and (not isinstance(self.torch_threads, int) or self.torch_threads < 1):
            raise ConfigError(f"torch_threads must be a positive integer or None, got {self.torch_threads!r}")
        if self.minibatch_size is not None and (not isinstance(self.minibatch_size, int) or self.minibatch_size < 1):
            raise ConfigError(f"minibatch_size must be a positive integer or None, got {self.minibatch_size!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ConfigError(f"max_tokens must be a positive integer or None, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        report_to = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        for name in report_to:
            if name not in _REPORTERS:
                raise ConfigError(f"report_to entries must be one of {_REPORTERS}, got {name!r}")
        self.report_to = tuple(report_to)
        self.runner.validate()
        self.serving = ServingConfig.of(self.serving)
        return self


def _task_id(task: Any, index: int) -> str:
    if isinstance(task, Mapping) and task.get("id") is not None:
        return str(task["id"])
    return f"task-{index}"


def _jobs(tasks: Sequence[Any]) -> list[RolloutJob]:
    jobs = [RolloutJob(_task_id(task, i), task) for i, task in enumerate(tasks)]
    seen: set[str] = set()
    for job in jobs:
        if job.task_id in seen:
            raise ConfigError(f"tasks: task id {job.task_id!r} appears twice; ids must be unique")
        seen.add(job.task_id)
    return jobs


class Trainer:
    """Trains ``model`` with ``algorithm`` from the traces of ``agent`` running ``tasks``."""

    def __init__(
        self,
        *,
        model: str | Path,
        agent: Callable[..., Any] | str | Sequence[str],
        tasks: Sequence[Any],
        algorithm: Any,
        val_tasks: Sequence[Any] | None = None,
        credit: Any = None,
        n_rollouts: int | None = None,
        tasks_per_step: int | None = None,
        max_steps: int | None = None,
        output_dir: str | Path | None = None,
        report_to: str | Sequence[str] | None = None,
        seed: int | None = None,
        resume: bool | None = None,
        prompt_template: str | None = None,
        config: TrainerConfig | None = None,
    ) -> None:
        """Keyword arguments override the same fields of ``config`` (a :class:`TrainerConfig`).

        ``prompt_template`` is given to every rollout's agent (``llm.prompt_template`` /
        ``SPANRL_PROMPT_TEMPLATE``); with ``algorithm=APO(...)`` it is the template optimisation starts from.
        """
        cfg = dataclasses.replace(config) if config is not None else TrainerConfig()
        for name, value in (
            ("n_rollouts", n_rollouts),
            ("tasks_per_step", tasks_per_step),
            ("max_steps", max_steps),
            ("output_dir", None if output_dir is None else str(output_dir)),
            ("report_to", report_to),
            ("seed", seed),
            ("resume", resume),
        ):
            if value is not None:
                setattr(cfg, name, value)
        self.config = cfg.validate()
        if not Path(model).is_dir():
            raise ConfigError(f"model must be a Hugging Face model folder, got {str(model)!r} (not a directory)")
        if not tasks:
            raise ConfigError("tasks must hold at least one task")
        if cfg.tasks_per_step > len(tasks):
            raise ConfigError(f"tasks_per_step ({cfg.tasks_per_step}) is larger than the number of tasks ({len(tasks)})")
        self._optimizes_prompt = callable(getattr(algorithm, "optimize", None)) and not callable(getattr(algorithm, "update", None))
        if prompt_template is not None and not isinstance(prompt_template, str):
            raise ConfigError(f"prompt_template must be a string, got {type(prompt_template).__name__}")
        if self._optimizes_prompt:
            if not prompt_template:
                raise ConfigError("prompt_template must be the initial template when the algorithm is APO, got None")
            if cfg.resume:
                raise ConfigError("resume must be False with APO: prompt optimisation keeps no checkpoints")
        else:
            for name in ("setup", "update", "save", "load_state"):
                if not callable(getattr(algorithm, name, None)):
                    raise ConfigError(f"algorithm must be an Algorithm (GRPO(...), SFT(...), APO(...), ...); it has no {name}()")
        algo_temperature = getattr(getattr(algorithm, "config", None), "temperature", None)
        if isinstance(algo_temperature, (int, float)) and cfg.temperature > 0 and algo_temperature != cfg.temperature:
            raise ConfigError(
                f"temperature {cfg.temperature!r} (the rollouts') differs from the algorithm's temperature "
                f"{algo_temperature!r} (what its log-probs divide the logits by); set both to the same value"
            )
        self.model_path = Path(model)
        self.agent = agent
        self.tasks = list(tasks)
        self.val_tasks = list(val_tasks or [])
        self._task_jobs = _jobs(self.tasks)
        self._val_jobs = _jobs(self.val_tasks)
        self.algorithm = algorithm
        self.prompt_template = prompt_template
        """The template every rollout's agent is given (None: its own prompt); APO's best after ``train()``."""
        self.apo_result: Any = None
        """The :class:`~spanrl.algorithms.apo.APOResult` of the last APO ``train()``."""
        self.credit = credit if credit is not None else LightningRL()
        self.output_dir = Path(cfg.output_dir)
        self.db_path = Path(cfg.db_path) if cfg.db_path else self.output_dir / DB_FILE
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.collector: Any = None
        self.server: Any = None
        self._runner: RolloutRunner | None = None
        self._reporter: Reporter | None = None
        self._run_tag = uuid.uuid4().hex[:8]  # rollout ids stay unique across runs sharing one store
        self._started = False

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Trainer:
        """Start the collector, load the policy (resuming if asked), start the server and the runner."""
        if self._started:
            return self
        from spanrl.collector import Collector, CollectorConfig
        from spanrl.serving import PolicyServer, ServerConfig

        cfg = self.config
        if cfg.torch_threads is not None:
            import torch

            torch.set_num_threads(cfg.torch_threads)
        if _distributed.world() > 1:
            if self._optimizes_prompt or not getattr(self.algorithm, "supports_distributed", False):
                raise ConfigError(
                    f"algorithm {type(self.algorithm).__name__} cannot train under {_distributed.world()} processes "
                    "(WORLD_SIZE); launch it as one process, or use GRPO"
                )
            if not _distributed.is_main():
                return self._start_follower()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        serving = cfg.serving
        self.collector = Collector(
            CollectorConfig(db_path=str(self.db_path), host=serving.collector_host, grpc_port=serving.collector_port, http_port=0)
        )
        self.collector.start()
        try:
            if not self._optimizes_prompt:
                self.algorithm.setup(
                    model_path=self.model_path, output_dir=self.output_dir, seed=cfg.seed, report_to=list(cfg.report_to)
                )
            serve_from = self.model_path
            checkpoint = self.latest_checkpoint() if cfg.resume else None
            if checkpoint is not None:
                self._load_checkpoint(checkpoint)
                serve_from = checkpoint
            self.server = PolicyServer(
                ServerConfig(
                    model=str(serve_from),
                    served_model_name=SERVED_MODEL_NAME,
                    host="127.0.0.1",
                    port=0,
                    otlp_endpoint=self.collector.grpc_endpoint,
                    max_batch_size=cfg.server_max_batch_size,
                    seed=cfg.seed,
                    backend=serving.backend,
                    device=serving.device,
                    dtype=serving.dtype,
                )
            )
            self.server.start()
            self.server = PolicyPool(
                serving, embedded=self.server, weights_dir=self.output_dir / "served-weights", model_dir=Path(serve_from)
            )
            self._runner = RolloutRunner(
                self.agent,
                config=cfg.runner,
                ready=self._ready,
                otel_env=self._agent_otel_env(),
                flush=self.server.force_flush,
            )
            if callable(self.agent):
                InProcessTracing.point_at(self._agent_otel_env()["OTEL_EXPORTER_OTLP_ENDPOINT"])
            if "tensorboard" in cfg.report_to or "wandb" in cfg.report_to:
                self._reporter = Reporter(cfg.report_to, self.output_dir / "runs", self._config_dict())
        except BaseException:
            self.close()
            raise
        self._started = True
        return self

    def _start_follower(self) -> Trainer:
        """A rank other than 0: only the algorithm (and its resumed state); no collector, server or runner."""
        cfg = self.config
        self.algorithm.setup(model_path=self.model_path, output_dir=self.output_dir, seed=cfg.seed, report_to=[])
        checkpoint = self.latest_checkpoint() if cfg.resume else None
        if checkpoint is not None:
            self._load_checkpoint(checkpoint)
        self._started = True
        return self

    def close(self) -> None:
        """Stop the runner, server and collector (the DuckDB file stays); safe twice."""
        for name, stop in (
            ("runner", lambda: self._runner and self._runner.close()),
            ("tracing", lambda: callable(self.agent) and self._started and InProcessTracing.point_at(None)),
            ("reporter", lambda: self._reporter and self._reporter.close()),
            ("server", lambda: self.server and self.server.shutdown()),
            ("collector", lambda: self.collector and self.collector.shutdown()),
        ):
            try:
                stop()
            except Exception:  # closing must go on
                _logger.exception("could not stop the %s", name)
        self._runner = self._reporter = None
        self.server = self.collector = None
        self._started = False

    def __enter__(self) -> Trainer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the loop ----------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Run until ``max_steps``; return the history (one dict per step, evaluations included)."""
        cfg = self.config
        owns = not self._started
        self.start()
        if not _distributed.is_main():
            try:
                self._follow()
            finally:
                if owns:
                    self.close()
            return []
        try:
            with self._progress() as progress:
                steps_bar = progress.add_task("steps", total=cfg.max_steps, completed=self.step) if progress else None
                if cfg.eval_at_start and self.val_tasks and self.step == 0:
                    self._record({"step": 0, "val_success": self.evaluate(progress=progress)})
                if self._optimizes_prompt:
                    self._optimize_prompt(progress)
                while not self._optimizes_prompt and self.step < cfg.max_steps:
                    row = self._train_step(progress)
                    last = self.step == cfg.max_steps
                    if self.val_tasks and (last or (cfg.eval_every and self.step % cfg.eval_every == 0)):
                        row["val_success"] = self.evaluate(progress=progress)
                    self._record(row)
                    if last or (cfg.save_every and self.step % cfg.save_every == 0):
                        self.save_checkpoint()
                    if progress is not None:
                        progress.update(steps_bar, completed=self.step, description=self._describe())
            self.plot()
        finally:
            if _distributed.world() > 1:
                _distributed.broadcast(None)  # the other ranks stop following
            if owns:
                self.close()
        return self.history

    def _update(self, transitions: Any) -> dict[str, float]:
        """One algorithm update; under many processes rank 0 broadcasts the transitions and every rank
        updates on its shard (the metrics are reduced over ranks: those of the whole batch)."""
        if _distributed.world() == 1:
            return self.algorithm.update(transitions)
        from spanrl.algorithms.base import transitions_of

        items = _distributed.broadcast(transitions_of(transitions))
        return self.algorithm.update(_distributed.shard_transitions(items))

    def _follow(self) -> None:
        """Ranks other than 0: update on each broadcast batch until rank 0 broadcasts None."""
        while (items := _distributed.broadcast(None)) is not None:
            self.algorithm.update(_distributed.shard_transitions(items))

    def _train_step(self, progress: Any) -> dict[str, Any]:
        """Rollouts, transitions, update(s), weight push; returns the step's history row (not recorded)."""
        cfg = self.config
        started = time.perf_counter()
        step = self.step + 1
        sampler = random.Random(cfg.seed * _STEP_SEED_STRIDE + step)
        chosen = sampler.sample(self._task_jobs, cfg.tasks_per_step)
        jobs = [job for job in chosen for _ in range(cfg.n_rollouts)]
        sampling: dict[str, Any] = {"temperature": cfg.temperature}
        if cfg.max_tokens is not None:
            sampling["max_tokens"] = cfg.max_tokens
        results = self._run(jobs, prefix=f"{self._run_tag}-s{step}-", sampling=sampling, mode="train", progress=progress)
        ok_ids = [r.rollout_id for r in results if r.ok]
        row: dict[str, Any] = {
            "step": step,
            "rollouts_ok": len(ok_ids),
            "rollouts_failed": sum(not r.ok for r in results),
            "policy_version": self._policy_version(),
        }
        rollout_seconds = time.perf_counter() - started
        metrics: dict[str, float] = {}
        if ok_ids:
            batch = self._transitions(ok_ids)
            rewards = [float(v) for v in batch.rewards_by_rollout.values() if v is not None]
            row["reward_mean"] = sum(rewards) / len(rewards) if rewards else None
            transitions = list(batch.transitions)
            row["transitions"] = len(transitions)
            row["transitions_report"] = dict(batch.report)
            if transitions:
                row["advantage_mean"] = sum(t.advantage for t in transitions) / len(transitions)
            if transitions:
                for _ in range(cfg.updates_per_step):
                    if cfg.minibatch_size and cfg.minibatch_size < len(transitions):
                        metrics = self._update(sampler.sample(transitions, cfg.minibatch_size))
                    else:
                        metrics = self._update(batch)
                row["policy_version"] = self.server.reload(self._policy_weights())
            else:
                _logger.warning("step %d: %d rollouts gave no transitions; no update", step, len(ok_ids))
        else:
            _logger.warning("step %d: every rollout failed; no update (see %s)", step, ROLLOUTS_FILE)
        row.update({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))})
        row["time/rollouts_s"] = rollout_seconds
        row["time/step_s"] = time.perf_counter() - started
        self.step = step
        return row

    def _optimize_prompt(self, progress: Any) -> None:
        """APO: beam search over templates, each scored by rollouts on one fixed sample of tasks."""
        from spanrl.algorithms.apo import Evaluation

        cfg = self.config
        chosen = random.Random(cfg.seed).sample(self._task_jobs, cfg.tasks_per_step)
        jobs = [job for job in chosen for _ in range(cfg.n_rollouts)]
        tasks = {job.task_id: job.task for job in chosen}
        sampling: dict[str, Any] = {"temperature": cfg.temperature}
        if cfg.max_tokens is not None:
            sampling["max_tokens"] = cfg.max_tokens

        def score(template: str) -> Evaluation:
            started = time.perf_counter()
            step = self.step + 1
            results = self._run(
                jobs, prefix=f"{self._run_tag}-p{step}-", sampling=sampling, mode="train", progress=progress, template=template
            )
            ok = [r for r in results if r.ok]
            rewards = self._final_rewards([r.rollout_id for r in ok])
            outcomes = sorted((rewards.get(r.rollout_id) or 0.0, r.task_id) for r in ok)
            mean = sum(reward for reward, _ in outcomes) / len(jobs)  # a rollout that never succeeded counts 0
            self.step = step
            self._record({
                "step": step, "rollouts_ok": len(ok), "rollouts_failed": sum(not r.ok for r in results),
                "reward_mean": mean, "prompt_template": template, "time/step_s": time.perf_counter() - started,
            })
            examples = [f"task {json.dumps(tasks[task_id])[:200]} -> reward {reward:g}" for reward, task_id in outcomes]
            return Evaluation(score=mean, examples=examples)

        result = self.algorithm.optimize(self.prompt_template, score)
        result.save(self.output_dir / APO_RESULT_FILE)
        self.apo_result, self.prompt_template = result, result.best_template
        row: dict[str, Any] = {
            "step": self.step, "apo/initial_score": result.initial_score, "apo/best_score": result.best_score,
            "prompt_template": result.best_template,
        }
        if self.val_tasks:
            row["val_success"] = self.evaluate(progress=progress)
        self._record(row)

    def evaluate(self, tasks: Sequence[Any] | None = None, *, progress: Any = None) -> float:
        """Held-out success: one greedy rollout per task through the policy server; the mean final
        reward, a failed rollout counting as 0. Uses ``val_tasks`` when ``tasks`` is None."""
        owns = not self._started
        self.start()
        try:
            jobs = self._val_jobs if tasks is None else _jobs(tasks)
            if not jobs:
                raise ConfigError("evaluate needs tasks: pass tasks= or give the Trainer val_tasks")
            sampling: dict[str, Any] = {"temperature": 0.0}
            if self.config.max_tokens is not None:
                sampling["max_tokens"] = self.config.max_tokens
            results = self._run(
                jobs, prefix=f"{self._run_tag}-v{self.step}-", sampling=sampling, mode="val", progress=progress, policy=True
            )
            ok_ids = [r.rollout_id for r in results if r.ok]
            rewards = self._final_rewards(ok_ids)
            return sum(rewards.get(i) or 0.0 for i in ok_ids) / len(jobs)
        finally:
            if owns:
                self.close()

    def collect(self, tasks: Sequence[Any], *, n_rollouts: int = 1, mode: str = "train") -> list[RolloutResult]:
        """Run rollouts without updating (e.g. to record demonstrations); return every attempt's result."""
        self.start()
        jobs = [job for job in _jobs(tasks) for _ in range(n_rollouts)]
        sampling = {"temperature": self.config.temperature}
        return self._run(jobs, prefix=f"{self._run_tag}-c{self.step}-", sampling=sampling, mode=mode, progress=None)

    def deploy(self) -> Any:
        """Serve the trained policy and return an ``openai.OpenAI`` client for it (``client.base_url``).

        The Trainer's own server is used when it is running; otherwise one is started on the newest
        checkpoint and stopped by :meth:`close`.
        """
        import openai

        if self.server is None:
            from spanrl.serving import PolicyServer, ServerConfig

            checkpoint = self.latest_checkpoint()
            if checkpoint is None:
                raise TrainingError(f"nothing to deploy: no {CHECKPOINT_PREFIX}<step> folder in {self.output_dir}")
            self.server = PolicyServer(
                ServerConfig(model=str(checkpoint), served_model_name=SERVED_MODEL_NAME, host="127.0.0.1", port=0, otlp_endpoint=None)
            )
            self.server.start()
        return openai.OpenAI(base_url=f"{self.server.base_url}/v1", api_key="spanrl")

    # --- checkpoints -------------------------------------------------------------------------------
    def latest_checkpoint(self) -> Path | None:
        """The newest ``checkpoint-<step>`` folder holding a trainer state, or None."""
        found: list[tuple[int, Path]] = []
        for path in self.output_dir.glob(f"{CHECKPOINT_PREFIX}*"):
            match = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d+)", path.name)
            if match and (path / TRAINER_STATE_FILE).is_file():
                found.append((int(match.group(1)), path))
        return max(found)[1] if found else None

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-<step>/``: the algorithm's HF folder and state, plus the trainer state."""
        path = self.output_dir / f"{CHECKPOINT_PREFIX}{self.step}"
        self.algorithm.save(path)
        state = {"step": self.step, "history": self.history, "config": self._config_dict()}
        (path / TRAINER_STATE_FILE).write_text(json.dumps(state, indent=1, default=str))
        return path

    def _load_checkpoint(self, path: Path) -> None:
        state = json.loads((path / TRAINER_STATE_FILE).read_text())
        self.algorithm.load_state(path)
        self.step = int(state["step"])
        self.history = list(state.get("history", []))
        _logger.info("resumed from %s at step %d", path, self.step)

    # --- helpers -----------------------------------------------------------------------------------
    def plot(self) -> Path:
        """Write ``output_dir/reward_curve.png`` from the history."""
        from spanrl.trainer.plotting import plot_reward_curve

        return plot_reward_curve(self.history, self.output_dir / CURVE_FILE, title=f"spanrl: {self.output_dir.name}")

    def _run(
        self,
        jobs: Sequence[RolloutJob],
        *,
        prefix: str,
        sampling: dict[str, Any],
        mode: str,
        progress: Any,
        policy: bool = False,
        template: str | None = None,
    ) -> list[RolloutResult]:
        assert self._runner is not None and self.server is not None
        llm_url = self.server if policy or not self.config.llm_url else self.config.llm_url  # a pool: lease()
        bar = progress.add_task(f"rollouts ({mode})", total=len(jobs)) if progress is not None else None
        log_path = self.output_dir / ROLLOUTS_FILE

        def on_result(result: RolloutResult) -> None:
            if not result.ok:
                _logger.warning("rollout %s %s: %s", result.rollout_id, result.status, result.error)
            if progress is not None and (result.ok or result.attempt == self.config.runner.max_attempts):
                progress.advance(bar)

        started = time.time()
        version = self._policy_version()
        results = self._runner.run(
            jobs, id_prefix=prefix, llm_url=llm_url, model=SERVED_MODEL_NAME, sampling=sampling, mode=mode,
            on_result=on_result, prompt_template=template if template is not None else self.prompt_template,
        )
        with log_path.open("a") as log:
            for r in results:
                row = {**dataclasses.asdict(r), "step": self.step, "policy_version": version, "time": started}
                log.write(json.dumps(row) + "\n")
        if progress is not None:
            progress.remove_task(bar)
        return results

    def _ready(self, rollout_ids: Sequence[str], since_ns: int) -> set[str]:
        """Rollouts whose reward (and, if required, the server's token span) is committed.

        Looks only at spans ingested since ``since_ns`` (DuckDB skips older row groups), so the poll
        stays cheap as the store grows. A reward is a typed reward span or a reward event."""
        query = (
            "SELECT rollout_id, "
            "bool_or(reward_value IS NOT NULL OR (events IS NOT NULL AND (contains(events, ?) OR contains(events, ?)))) AS rewarded, "
            "bool_or(completion_token_ids IS NOT NULL) AS tokens "
            "FROM spans WHERE ingested_ns >= ? AND list_contains(?, rollout_id) GROUP BY rollout_id"
        )
        params = [semconv.REWARD_SPAN_NAME, semconv.GEN_AI_EVALUATION_RESULT_EVENT, since_ns, list(rollout_ids)]
        rows = self.collector.store.sql(query, params).to_pylist()
        need_tokens = self.config.runner.require_token_spans and not self.config.llm_url
        return {r["rollout_id"] for r in rows if r["rewarded"] and (r["tokens"] or not need_tokens)}

    def _final_rewards(self, rollout_ids: Sequence[str]) -> dict[str, float | None]:
        if not rollout_ids:
            return {}
        table = self.collector.store.sql(
            "SELECT rollout_id, final_reward FROM rollouts WHERE list_contains(?, rollout_id)", [list(rollout_ids)]
        )
        return dict(zip(table.column("rollout_id").to_pylist(), table.column("final_reward").to_pylist()))

    def _transitions(self, rollout_ids: Sequence[str]) -> Any:
        """The rollouts' transitions with advantages from ``credit``; for an algorithm with a critic
        (``needs_values``, e.g. PPO) two passes: the critic values the states of the first, then GAE with
        the algorithm's ``gamma``/``lam`` gives raw (unwhitened) advantages; the credit's selection rules
        (``reward_name``, ``missing_reward``, ...) are kept."""
        from spanrl.algorithms.transitions import load_transitions

        kwargs: dict[str, Any] = {"rollout_ids": list(rollout_ids), "tokenizer": self.algorithm.tokenizer}
        if self.config.agent_name:
            kwargs["agents"] = [self.config.agent_name]
        if not getattr(self.algorithm, "needs_values", False):
            return load_transitions(self.collector.store, credit=self.credit, **kwargs)
        states = load_transitions(
            self.collector.store, credit=dataclasses.replace(self.credit, mode="identical", baseline="none"), **kwargs
        )
        if not len(states):
            return states
        algo_cfg = self.algorithm.config
        # unwhitened: the algorithm's value target is advantages + V(s) (PPO whitens per mini-batch itself)
        gae = dataclasses.replace(
            self.credit, mode="gae", gamma=algo_cfg.gamma, lam=algo_cfg.lam, baseline="none", scale_std=False
        )
        return load_transitions(self.collector.store, credit=gae, values=self.algorithm.value_map(states), **kwargs)

    def _policy_weights(self) -> Any:
        """What the server reloads: plain-keyed weights (a LoRA adapter merged), else the model itself."""
        weights = getattr(self.algorithm, "policy_weights", None)
        return weights() if callable(weights) else self.algorithm.model

    def _policy_version(self) -> int | None:
        return getattr(self.server, "version", None)

    def _agent_otel_env(self) -> dict[str, str]:
        endpoint = self.collector.grpc_endpoint
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint if "://" in endpoint else f"http://{endpoint}",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
        }

    def _record(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        with (self.output_dir / HISTORY_FILE).open("a") as f:
            f.write(json.dumps(row) + "\n")
        self._report(row)
        _logger.info("step %s: %s", row.get("step"), {k: v for k, v in row.items() if k != "step"})

    def _report(self, row: Mapping[str, Any]) -> None:
        if self._reporter is None:
            return
        scalars = {
            ("charts/" + k if "/" not in k else k): float(v)
            for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self._reporter.log(int(row["step"]), scalars)

    def _describe(self) -> str:
        last = self.history[-1] if self.history else {}
        reward = last.get("reward_mean")
        return f"steps (reward {reward:.2f})" if isinstance(reward, float) else "steps"

    def _progress(self) -> Any:
        if not self.config.progress:
            return NoProgress()
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())

    def _config_dict(self) -> dict[str, Any]:
        algo_cfg = getattr(self.algorithm, "config", None)
        return {
            "trainer": dataclasses.asdict(self.config),
            "model": str(self.model_path),
            "agent": self.agent if isinstance(self.agent, (str, list, tuple)) else getattr(self.agent, "__qualname__", repr(self.agent)),
            "algorithm": {"name": type(self.algorithm).__name__, **(dataclasses.asdict(algo_cfg) if dataclasses.is_dataclass(algo_cfg) else {})},
            "credit": dataclasses.asdict(self.credit) if dataclasses.is_dataclass(self.credit) else repr(self.credit),
            "prompt_template": self.prompt_template,
            "n_tasks": len(self.tasks),
            "n_val_tasks": len(self.val_tasks),
        }

    def _write_config(self) -> None:
        (self.output_dir / CONFIG_FILE).write_text(json.dumps(self._config_dict(), indent=1, default=str))
