"""The careless SQL demonstrator for the tiny-vocabulary subset: the SFT warm start's teacher.

It writes the gold query for three of the five question shapes, and makes one systematic mistake
``ERROR_RATE`` of the time on the other two: it forgets the department filter when counting projects
(runs, wrong count) and takes salaries from the projects table (an error). Neither mistake is another
shape's gold query, so rewarding one shape never reinforces another's mistake. A model imitating it learns
the mistake as the most likely answer there, so greedy accuracy after SFT stays well below 1 and RL from
the execution reward has something to fix.
 (A clean teacher
reaches 1.0 by SFT alone and leaves RL nothing to show.)
"""

from __future__ import annotations

import random
from typing import Any

from examples.text2sql.make_data import TINY_TEMPLATES

ERROR_RATE = 0.7
_MISTAKES = {  # template -> the systematic wrong query, by department id
    "tiny_count_proj": "SELECT COUNT(*) FROM projects",
    "tiny_max_salary": "SELECT MAX(salary) FROM projects WHERE dept_id = {d}",
}


def _shape(question: str) -> tuple[str, str] | None:
    """(template name, department id) of a tiny question, or None."""
    words = question.split()
    for name, pattern, _ in TINY_TEMPLATES:
        if pattern.split()[:-1] == words[:-1] and len(words) == len(pattern.split()):
            return name, words[-1]
    return None


def demonstrate(question: str, rng: random.Random, *, error_rate: float = ERROR_RATE) -> str:
    """The demonstrator's SQL for one tiny question (``""`` for a question it does not know)."""
    shape = _shape(question)
    if shape is None:
        return ""
    name, d = shape
    if name in _MISTAKES and rng.random() < error_rate:
        return _MISTAKES[name].format(d=d)
    return next(sql for n, _, sql in TINY_TEMPLATES if n == name).format(d=d)


def answer(messages: list[dict[str, Any]], rng: random.Random) -> str:
    """``TeacherServer`` callback: answer the last user message."""
    question = next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"), "")
    return demonstrate(question, rng)
