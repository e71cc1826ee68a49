"""The calculator task: tasks, the tool, the reward and an imperfect scripted demonstrator.

A task asks for one arithmetic operation in words, e.g. ``"30 sub 7"``; the model must answer with one
tool call, ``<call> sub 30 7 </call>`` (the tiny tokenizer's rendering of an OpenAI tool call). The agent
runs the tool; the reward is 1.0 when the tool's result equals the task's answer, else 0.0 (a swapped
``add`` or ``mul`` is therefore still right, a swapped ``sub`` or ``div`` is not).

The demonstrator answers like a careless teacher: on ``sub`` and ``div`` it swaps the operands
``DEMO_ERROR_RATE`` of the time; otherwise it is right. Supervised fine-tuning on its traces learns the
swap as the likelier answer on those two operations, which RL from the reward then corrects.

Standard library only: the agent process, the demonstrator server and the demo all import it.
"""

from __future__ import annotations

import random
import re
from typing import Any

__all__ = [
    "DEMO_ERROR_RATE",
    "MAX_OPERAND",
    "OPS",
    "TOOL_SCHEMAS",
    "apply_tool",
    "demonstrate",
    "make_tasks",
    "parse_call",
    "reward",
    "split_tasks",
    "vocabulary",
]

OPS: tuple[str, ...] = ("add", "sub", "mul", "div")
"""Tool names; each takes two integer operands."""

MAX_OPERAND = 49
"""Operands are integers 0..MAX_OPERAND (``div`` divisors 1..MAX_OPERAND)."""

DEMO_ERROR_RATE = 0.7
"""How often the demonstrator swaps the operands of ``sub`` and ``div``."""

DEMO_CARELESS_OPS: tuple[str, ...] = ("sub", "div")
"""Operations the demonstrator gets wrong ``DEMO_ERROR_RATE`` of the time."""

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": op,
            "description": f"{op} two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
    for op in OPS
]
"""OpenAI tool definitions, one per operation, arguments ``a`` then ``b``."""

_CALL_RE = re.compile(r"<call>\s+(\S+)((?:\s+-?\d+)*)\s+</call>")


def vocabulary() -> list[str]:
    """Every word a task or an answer uses (the tiny tokenizer adds roles, ``<call>``, ``</call>``)."""
    return [*OPS, *(str(n) for n in range(MAX_OPERAND + 1))]


def make_tasks(n: int | None = None, *, seed: int = 0) -> list[dict[str, Any]]:
    """Tasks ``{"id", "question", "op", "a", "b"}``; all of them (shuffled) when ``n`` is None.

    The whole space has 4 x 50 x 50 - 50 tasks (no division by zero); ids are stable: ``"add-3-4"``.
    """
    tasks = [
        {"id": f"{op}-{a}-{b}", "question": f"{a} {op} {b}", "op": op, "a": a, "b": b}
        for op in OPS
        for a in range(MAX_OPERAND + 1)
        for b in range(MAX_OPERAND + 1)
        if not (op == "div" and b == 0)
    ]
    random.Random(seed).shuffle(tasks)
    if n is not None:
        if not 0 <= n <= len(tasks):
            raise ValueError(f"n must be between 0 and {len(tasks)}, got {n!r}")
        tasks = tasks[:n]
    return tasks


def split_tasks(
    n_train: int, n_val: int, *, seed: int = 0, ops: tuple[str, ...] = OPS
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Disjoint train and held-out task lists over ``ops``, the held-out ones balanced over them."""
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise ValueError(f"ops must be a non-empty subset of {OPS}, got {ops!r}")
    tasks = [t for t in make_tasks(seed=seed) if t["op"] in ops]
    val: list[dict[str, Any]] = []
    per_op = {op: 0 for op in ops}
    for task in tasks:
        if len(val) < n_val and per_op[task["op"]] < -(-n_val // len(ops)):
            val.append(task)
            per_op[task["op"]] += 1
    val_ids = {t["id"] for t in val}
    train = [t for t in tasks if t["id"] not in val_ids][:n_train]
    return train, val


def apply_tool(op: str, a: int, b: int) -> int:
    """Run the calculator tool; ``ValueError`` for an unknown operation or a division by zero."""
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        if b == 0:
            raise ValueError("div: division by zero")
        return a // b
    raise ValueError(f"unknown operation {op!r}; expected one of {OPS}")


def parse_call(text: str | None) -> tuple[str, list[int]] | None:
    """``("sub", [30, 7])`` from ``"<call> sub 30 7 </call>"``; None when the text holds no call."""
    match = _CALL_RE.search(text or "")
    if match is None:
        return None
    return match.group(1), [int(x) for x in match.group(2).split()]


def reward(task: dict[str, Any], call: tuple[str, list[int]] | None) -> float:
    """1.0 when the call is one of the tools, with two operands, and gives the task's answer; else 0.0."""
    if call is None:
        return 0.0
    op, args = call
    if len(args) != 2:
        return 0.0
    try:
        return 1.0 if apply_tool(op, *args) == apply_tool(task["op"], task["a"], task["b"]) else 0.0
    except ValueError:
        return 0.0


def demonstrate(question: str, rng: random.Random) -> str:
    """The careless demonstrator's answer to a question like ``"30 sub 7"``."""
    words = question.split()
    if len(words) != 3:
        raise ValueError(f"question must be 'A OP B', got {question!r}")
    a, op, b = words
    if op in DEMO_CARELESS_OPS and rng.random() < DEMO_ERROR_RATE:
        a, b = b, a
    return f"<call> {op} {a} {b} </call>"
