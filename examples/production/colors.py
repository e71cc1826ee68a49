"""The production example's task: name the colour of a thing, in one word.

Standard library only (the agent, the feedback service and the tests import it). The policy is the
tiny word-level model (``spanrl.demo.tiny``) over ``VOCABULARY``; an answer is right when it
contains the task's colour, which a random policy does about one time in ten.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TASKS", "VOCABULARY", "is_right", "task_for"]

TASKS: tuple[dict[str, str], ...] = (
    {"id": "sky", "question": "the sky is", "answer": "blue"},
    {"id": "grass", "question": "the grass is", "answer": "green"},
    {"id": "snow", "question": "the snow is", "answer": "white"},
)
"""The requests users send (task id, question, the colour a user accepts)."""

VOCABULARY: tuple[str, ...] = ("the", "sky", "grass", "snow", "is", "blue", "green", "white", "red")
"""Words of the tiny model's tokenizer."""


def task_for(n: int) -> dict[str, str]:
    """The n-th request's task (round robin: a steady mix)."""
    return TASKS[n % len(TASKS)]


def is_right(task: dict[str, Any], answer: str) -> bool:
    """Whether the user is satisfied: the answer names the task's colour."""
    return task["answer"] in answer.split()
