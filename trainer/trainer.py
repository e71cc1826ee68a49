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
the :class:`~spanrl.rollouts.runner.RolloutRunner` (bounded, retried, waited for until their spans are
committed), decomposes them with ``load_transitions`` (credit assignment included), updates the policy,
pushes the weights into the server (in process) and logs. Failed rollouts are recorded in
``output_dir/rollouts.jsonl`` and excluded; a step or evaluation none of whose rollouts succeeded stops the
run with the reason (``preflight.py``, which also checks the agent and the run folder before the first rollout).

Output: ``checkpoint-<step>/`` (HF folder + optimizer/RNG state + ``trainer_state.json``),
``config.json`` (resolved), ``history.jsonl``, ``reward_curve.png``, ``runs/`` (TensorBoard).
``resume=True`` continues from the newest checkpoint: same step count, history and task sequence.
``async_steps=True`` runs the next step's rollouts while the current update computes (``rollouts/prefetch.py``).

Many processes (``accelerate launch --num_processes N train.py``, GRPO): rank 0 does everything above;
the other ranks only set the algorithm up and, each update, receive rank 0's transitions (broadcast),
update on their shard and average gradients, so every rank holds the same weights. ``train()`` returns
the history on rank 0 and an empty list elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


from spanrl.algorithms import distributed as _distributed
from spanrl.algorithms.presets import trainer_credit
from spanrl.errors import ConfigError, TrainingError
from spanrl.store import rollouts as store_rollouts
from spanrl.algorithms import checkpoint_folders as checkpoints
from spanrl.trainer.config import (
    APO_RESULT_FILE,
    CHECKPOINT_PREFIX,
    CONFIG_FILE,
    CURVE_FILE,
    DB_FILE,
    HISTORY_FILE,
    ROLLOUTS_FILE,
    SERVED_MODEL_NAME,
    TRAINER_STATE_FILE,
    TrainerConfig,
    check_arguments,
    run_description,
)
from spanrl.trainer.console import Console
from spanrl.trainer.preflight import check_before_start, no_rollout_succeeded
from spanrl.trainer.lifecycle import Lifecycle, State
from spanrl.rollouts.prefetch import RolloutPrefetch, StepRollouts
from spanrl.trainer.reporting import Callback, CurvePlot, HistoryFile, RowLog, Scalars
from spanrl.trainer.training_step import Taken, TrainingStep
from spanrl.rollouts.rollouts import jobs_of
from spanrl.rollouts.runner import RolloutJob, RolloutResult
from spanrl import seeding
from spanrl.trainer.services import Services

__all__ = [
    "APO_RESULT_FILE", "CHECKPOINT_PREFIX", "CONFIG_FILE", "CURVE_FILE", "DB_FILE", "HISTORY_FILE", "ROLLOUTS_FILE",
    "SERVED_MODEL_NAME", "TRAINER_STATE_FILE", "State", "Trainer", "TrainerConfig",
]

_logger = logging.getLogger(__name__)


class Trainer(Lifecycle):
    """Trains ``model`` with ``algorithm`` from the traces of ``agent`` running ``tasks``."""

    _WORDS = {"loop": "train()", "ready": "set up", "ready_again": "set it up"}
    _STATE_FIELD = "state"

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
        policies: dict[str, Any] | None = None,
    ) -> None:
        """Keyword arguments override the same fields of ``config`` (a :class:`TrainerConfig`).

        ``prompt_template`` is given to every rollout's agent (``llm.prompt_template`` /
        ``SPANRL_PROMPT_TEMPLATE``); with ``algorithm=APO(...)`` it is the template optimisation starts from.
        ``policies``: agent name -> ``AgentPolicy``, one LoRA adapter per agent on the one base, trained together
        with ``algorithm``'s settings (``spanrl.algorithms.policies``).
        """
        if policies:
            from spanrl.algorithms.policies import per_agent

            algorithm = per_agent(algorithm, policies)
        overrides = {"n_rollouts": n_rollouts, "tasks_per_step": tasks_per_step, "max_steps": max_steps,
                     "output_dir": None if output_dir is None else str(output_dir), "report_to": report_to,
                     "seed": seed, "resume": resume}
        cfg = dataclasses.replace(config or TrainerConfig(), **{k: v for k, v in overrides.items() if v is not None})
        self.config = cfg.validate()
        self._optimizes_prompt = check_arguments(cfg, model, tasks, algorithm, prompt_template)
        self.model_path = Path(model)
        self.agent = agent
        self.tasks = list(tasks)
        self.val_tasks = list(val_tasks or [])
        self._task_jobs = jobs_of(self.tasks)
        self._val_jobs = jobs_of(self.val_tasks)
        self.algorithm = algorithm
        self.prompt_template = prompt_template
        """The template every rollout's agent is given (None: its own prompt); APO's best after ``train()``."""
        self.apo_result: Any = None
        """The :class:`~spanrl.algorithms.apo.APOResult` of the last APO ``train()``."""
        self.credit = trainer_credit(getattr(algorithm, "config", None), credit)  # checked before any rollout
        self.output_dir = Path(cfg.output_dir)
        self.db_path = Path(cfg.db_path) if cfg.db_path else self.output_dir / DB_FILE
        self.step = 0
        self.history: list[dict[str, Any]] = []
        self.state = State.NEW
        self._world = 1  # processes (WORLD_SIZE), decided by start()
        self._services = Services()
        self._callbacks: list[Callback] = []
        self._console: Console | None = None
        self._prefetch: RolloutPrefetch | None = None  # inside train(): runs rollouts (ahead, with async_steps)
        self._training: TrainingStep | None = None  # transitions, update(s), weight push: made by start()
        self._run_tag = uuid.uuid4().hex[:8]  # rollout ids stay unique across runs sharing one store
        self._unpin: Callable[[], None] = lambda: None  # restores torch's settings (seeding.start_run)

    @property
    def collector(self) -> Any:
        """The running collector (its ``store`` is the span store), or None."""
        return self._services.collector

    @property
    def server(self) -> Any:
        """The running policy server, or None."""
        return self._services.server

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> Trainer:
        """Start the collector, load the policy (resuming if asked), start the server and the runner.

        The process's rank is decided here, once: rank 0 (or the only process) runs everything; any
        other rank only sets the algorithm up and follows rank 0's updates (state FOLLOWING)."""
        if self.state in (State.RUNNING, State.TRAINING, State.FOLLOWING):
            return self
        cfg = self.config
        if cfg.torch_threads is not None:
            import torch

            torch.set_num_threads(cfg.torch_threads)
        self._world = _distributed.world()
        if self._world > 1:
            if self._optimizes_prompt or not getattr(self.algorithm, "supports_distributed", False):
                raise ConfigError(
                    f"algorithm {type(self.algorithm).__name__} cannot train under {self._world} processes "
                    "(WORLD_SIZE); launch it as one process, or use GRPO"
                )
            if not _distributed.is_main():
                self._setup_algorithm()
                self.state = State.FOLLOWING
                return self
        if self.state is State.NEW:  # before anything is written or any rollout runs
            check_before_start(self.output_dir, self.agent, cfg)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / CONFIG_FILE).write_text(json.dumps(run_description(self), indent=1, default=str))
        self._unpin = seeding.start_run(cfg, shown=cfg.progress)  # the seed printed, torch pinned
        try:
            self._services.start_collector(self.db_path, cfg.serving, reachable=bool(cfg.rollouts.advertise_host))
            serve_from = self._setup_algorithm()
            self._services.start_rest(agent=self.agent, serve_from=serve_from, config=cfg, ready=self._ready,
                                      output_dir=self.output_dir,
                                      adapters=getattr(self.algorithm, "serving_adapters", None))
            self._callbacks = self._reporting()
            self._training = TrainingStep(algorithm=self.algorithm, credit=self.credit, config=cfg,
                                          store=self.collector.store, server=self.server, world=self._world,
                                          max_bad_updates=cfg.max_bad_updates)
        except BaseException:
            self.close()
            raise
        self.state = State.RUNNING
        return self

    def _setup_algorithm(self) -> Path:
        """Set the algorithm up (not APO: it has no weights), resuming if asked; returns what to serve."""
        if self._optimizes_prompt:
            return self.model_path
        self.algorithm.setup(model_path=self.model_path, output_dir=self.output_dir, seed=self.config.seed)
        checkpoint = self.latest_checkpoint() if self.config.resume else None
        if checkpoint is None:
            return self.model_path
        self.algorithm.load_state(checkpoint)
        self.step, self.history = checkpoints.read_trainer_state(checkpoint)
        _logger.info("resumed from %s at step %d", checkpoint, self.step)
        return self.model_path if getattr(self.algorithm, "serving_adapters", None) else checkpoint  # adapters: base

    def _reporting(self) -> list[Callback]:
        cfg = self.config  # where each row goes, in order
        self._console = Console(max_steps=cfg.max_steps) if cfg.progress else None
        callbacks = [HistoryFile(self.output_dir / HISTORY_FILE), RowLog(),
                     Scalars(cfg.report_to, self.output_dir, run_description(self)), self._console,
                     CurvePlot(self.output_dir / CURVE_FILE, f"spanrl: {self.output_dir.name}")]
        return [c for c in callbacks if c is not None]

    def close(self) -> None:
        """Stop the runner, server and collector (the DuckDB file stays); safe twice."""
        self._close_callbacks()
        self._console = None
        self._services.close()
        self._unpin()
        self.state = State.CLOSED

    # --- the loop ----------------------------------------------------------------------------------
    def train(self) -> list[dict[str, Any]]:
        """Run until ``max_steps`` (or ``max_minutes``); return the history (one dict per step, evaluations
        included)."""
        self._refuse("train()", State.TRAINING)
        owns = self.state in (State.NEW, State.CLOSED)
        self.start()
        if self.state is State.FOLLOWING:
            try:
                while (items := _distributed.broadcast(None)) is not None:  # until rank 0 broadcasts None
                    self.algorithm.update(_distributed.shard_transitions(items))
            finally:
                if owns:
                    self.close()
            return []
        cfg = self.config
        self.state = State.TRAINING
        bound = cfg.max_staleness if cfg.async_steps else 0
        self._prefetch = RolloutPrefetch(self._step_rollouts, bound=bound, last_step=cfg.max_steps)
        try:
            with self._console.running(self.step) if self._console else contextlib.nullcontext():
                if cfg.eval_at_start and self.val_tasks and self.step == 0:
                    self.record({"step": 0, "val_success": self.evaluate()})
                if self._optimizes_prompt:
                    from spanrl.trainer.prompt_search import search_prompt

                    search_prompt(self)
                else:
                    assert self._training is not None
                    source = RunnerSource(self._prefetch, lambda step: self._step_jobs(step)[0])
                    ends = _StepEnds(self, None if cfg.max_minutes is None else time.monotonic() + 60 * cfg.max_minutes)
                    self._training.loop(source, step=self.step, done=ends.done, record=ends.record)
            for callback in self._callbacks:
                callback.on_end(self.history)
        finally:
            self._prefetch.close()  # rollouts run ahead and not trained are dropped (a resume runs them again)
            self.state, self._prefetch = State.RUNNING, None
            if self._world > 1:
                _distributed.broadcast(None)  # the other ranks stop following
            if owns:
                self.close()
        return self.history

    def _step_jobs(self, step: int) -> tuple[random.Random, list[RolloutJob]]:
        """Step ``step``'s seeded rollout jobs and the sampler that later picks minibatches (``spanrl.seeding``)."""
        return seeding.step_jobs(self._task_jobs, self.config, step)

    def _step_rollouts(self, step: int) -> StepRollouts:
        """Run step ``step``'s rollouts (in the loop's thread, or the prefetch's)."""
        started, version = time.perf_counter(), self._policy_version()
        results = self.run_rollouts(self._step_jobs(step)[1], tag=f"s{step}", mode="train")
        return StepRollouts(results, version, time.perf_counter() - started)

    # --- rollouts ----------------------------------------------------------------------------------
    def evaluate(self, tasks: Sequence[Any] | None = None, *, progress: Any = None) -> float:
        """Held-out success: one greedy rollout per task through the policy server; the mean final
        reward, a failed rollout counting as 0. Uses ``val_tasks`` when ``tasks`` is None.
        (``progress`` is accepted for compatibility; the Trainer's console shows the bars.)"""
        self._refuse("evaluate()", State.FOLLOWING)
        owns = self.state in (State.NEW, State.CLOSED)
        self.start()
        self._runner_free()
        try:
            jobs = self._val_jobs if tasks is None else jobs_of(tasks)
            if not jobs:
                raise ConfigError("evaluate needs tasks: pass tasks= or give the Trainer val_tasks")
            results = self.run_rollouts(jobs, tag=f"v{self.step}", mode="val", greedy=True)
            ok_ids = [r.rollout_id for r in results if r.ok]
            if not ok_ids:
                raise no_rollout_succeeded(f"evaluation at step {self.step}", results)
            rewards = self.final_rewards(ok_ids)
            return sum(rewards.get(i) or 0.0 for i in ok_ids) / len(jobs)
        finally:
            if owns:
                self.close()

    def collect(self, tasks: Sequence[Any], *, n_rollouts: int = 1, mode: str = "train") -> list[RolloutResult]:
        """Run rollouts without updating (e.g. to record demonstrations); return every attempt's result."""
        self._refuse("collect()", State.FOLLOWING)
        self.start()
        self._runner_free()
        jobs = [job for job in jobs_of(tasks) for _ in range(n_rollouts)]
        return self.run_rollouts(jobs, tag=f"c{self.step}", mode=mode)

    def deploy(self) -> Any:
        """Serve the trained policy and return an ``openai.OpenAI`` client for it (``client.base_url``).

        The Trainer's own server is used when it is running; otherwise one is started on the newest
        checkpoint and stopped by :meth:`close`.
        """
        import openai

        self._refuse("deploy()", State.FOLLOWING)
        if self.server is None:
            checkpoint = self.latest_checkpoint()
            if checkpoint is None:
                raise TrainingError(f"nothing to deploy: no {CHECKPOINT_PREFIX}<step> folder in {self.output_dir}")
            self._services.serve_only(checkpoint, self.config.serving)
        return openai.OpenAI(base_url=f"{self.server.base_url}/v1", api_key=self._services.api_key)

    def run_rollouts(
        self, jobs: Sequence[RolloutJob], *, tag: str, mode: str, greedy: bool = False, template: str | None = None
    ) -> list[RolloutResult]:
        """Run ``jobs`` (ids ``<run>-<tag>-<i>-a<attempt>``), log each attempt to ``rollouts.jsonl``.
        Training rollouts sample at ``temperature`` (from ``llm_url`` when set); greedy ones use the policy."""
        cfg, runner = self.config, self._services.runner
        assert runner is not None and self.server is not None
        sampling: dict[str, Any] = {"temperature": 0.0 if greedy else cfg.temperature}
        if cfg.max_tokens is not None:
            sampling["max_tokens"] = cfg.max_tokens
        # training rollouts: a teacher's URL, else the pool (each rollout lease()s one of its servers); greedy
        # evaluation: the pool too, so the run's fastest servers (serving.urls' vLLM) evaluate, not the embedded one
        llm_url = self.server if greedy else (cfg.llm_url or self.server)
        advance, remove = self._console.rollout_bar(mode, len(jobs)) if self._console else (lambda: None, lambda: None)

        def on_result(result: RolloutResult) -> None:
            if not result.ok:
                _logger.warning("rollout %s %s: %s", result.rollout_id, result.status, result.error)
            if result.ok or result.attempt == cfg.runner.max_attempts:
                advance()

        started, version = time.time(), self._policy_version()
        default, models = getattr(self.algorithm, "rollout_models", lambda: (SERVED_MODEL_NAME, {}))()
        try:
            results = runner.run(jobs, id_prefix=f"{self._run_tag}-{tag}-", llm_url=llm_url, model=default,
                                 agent_models=models, sampling=sampling, mode=mode, on_result=on_result,
                                 prompt_template=template if template is not None else self.prompt_template)
        finally:
            remove()
        with (self.output_dir / ROLLOUTS_FILE).open("a") as log:
            for r in results:
                row = {**dataclasses.asdict(r), "step": self.step, "policy_version": version, "time": started}
                log.write(json.dumps(row) + "\n")
        return results

    def _runner_free(self) -> None:
        """The runner runs one batch at a time: wait for rollouts running ahead (async steps)."""
        if self._prefetch is not None:
            self._prefetch.settle()

    def _ready(self, rollout_ids: Sequence[str], since_ns: int) -> set[str]:
        need = self.config.runner.require_token_spans and not self.config.llm_url
        return store_rollouts.ready(self.collector.store, rollout_ids, since_ns, need_token_ids=need)

    def final_rewards(self, rollout_ids: Sequence[str]) -> dict[str, float | None]:
        """Each rollout's final reward in the store (None: it has none)."""
        return store_rollouts.final_rewards(self.collector.store, rollout_ids)

    # --- checkpoints, history, config ---------------------------------------------------------------
    def latest_checkpoint(self) -> Path | None:
        """The newest ``checkpoint-<step>`` folder holding a trainer state, or None."""
        return checkpoints.latest(self.output_dir)

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-<step>/``: the algorithm's HF folder and state, plus the trainer state."""
        self._refuse("save_checkpoint()", State.NEW, State.FOLLOWING)
        path = checkpoints.path_of(self.output_dir, self.step)
        self.algorithm.save(path)
        checkpoints.write_trainer_state(path, step=self.step, history=self.history, config=run_description(self))
        return path

    def plot(self) -> Path:
        """Write ``output_dir/reward_curve.png`` from the history."""
        from spanrl.trainer.plotting import plot_reward_curve

        return plot_reward_curve(self.history, self.output_dir / CURVE_FILE, title=f"spanrl: {self.output_dir.name}")

    def record(self, row: dict[str, Any]) -> None:
        """Add a history row (its ``step`` becomes the Trainer's) and hand it to the reporting callbacks."""
        self.step = row["step"]
        self.history.append(row)
        for callback in self._callbacks:
            callback.on_row(row)

    def _policy_version(self) -> int | None:
        return None if self.server is None else self.server.version


class RunnerSource:
    """The Trainer's source of the loop's rollouts (``training_step.Source``): each step's seeded jobs through the
    runner, run now or ahead while the last update computed (``prefetch``); ``sampler_of(step)`` picks the step's
    minibatches. It commits nothing (the Trainer checkpoints after recording the row, every ``save_every``)."""

    last_good = "GRPO and PPO skipped the non-finite optimizer steps, and none was pushed to the server"

    def __init__(self, prefetch: RolloutPrefetch, sampler_of: Callable[[int], random.Random]) -> None:
        self.prefetch, self.sampler_of = prefetch, sampler_of

    def take(self, step: int) -> Taken:
        sampler = self.sampler_of(step)
        got, waited = self.prefetch.take(step)
        self.prefetch.ahead(step)  # the next steps' rollouts run while this step updates
        ok_ids = [r.rollout_id for r in got.results if r.ok]
        return Taken(ok_ids, got.policy_version, sampler=sampler, own=(got, waited))

    def commit(self, step: int, got: Taken, batch: Any, marks: dict[str, str]) -> None:
        if batch is None and not got.rollout_ids:
            raise no_rollout_succeeded(f"step {step}", got.own[0].results)
        if batch is None or not len(batch):
            _logger.warning("step %d: %d rollouts gave no transitions; no update", step, len(got.rollout_ids))

    def undo(self, step: int, got: Taken, batch: Any, marks: dict[str, str]) -> bool:
        return True  # the step stands: its row is recorded

    def report(self, step: int, got: Taken, batch: Any, row: dict[str, Any]) -> dict[str, Any]:
        rollouts, waited = got.own
        ok = len(got.rollout_ids)
        return {**row, "rollouts_ok": ok, "rollouts_failed": len(rollouts.results) - ok,
                "time/rollouts_s": rollouts.seconds, "time/rollout_wait_s": waited}


class _StepEnds:
    """What follows each of the Trainer's steps: an evaluation when due, the row recorded, a checkpoint when due;
    the last step is ``max_steps`` or the first to end past ``deadline`` (``max_minutes``)."""

    def __init__(self, trainer: Trainer, deadline: float | None) -> None:
        self.trainer, self.deadline, self.last = trainer, deadline, False

    def done(self, step: int) -> bool:
        return self.last or step >= self.trainer.config.max_steps

    def record(self, row: dict[str, Any]) -> None:
        trainer, cfg, step = self.trainer, self.trainer.config, row["step"]
        trainer.step = step  # the evaluation's rollouts are named after it
        self.last = step >= cfg.max_steps or (self.deadline is not None and time.monotonic() >= self.deadline)
        if trainer.val_tasks and (self.last or (cfg.eval_every and step % cfg.eval_every == 0)):
            eval_started = time.perf_counter()
            row["val_success"] = trainer.evaluate()
            row["time/eval_s"] = time.perf_counter() - eval_started
        trainer.record(row)
        if self.last or (cfg.save_every and step % cfg.save_every == 0):
            trainer.save_checkpoint()
