"""Careless SQL demonstrators, the SFT warm starts' teachers: one for the tiny-vocabulary subset
(``train_tiny.py``), one for the writer + checker pair on the full questions (``compare_policies.py``).

The tiny one writes the gold query for three of the five question shapes, and makes one systematic mistake
``ERROR_RATE`` of the time on the other two: it forgets the department filter when counting projects
(runs, wrong count) and takes salaries from the projects table (an error). Neither mistake is another
shape's gold query, so rewarding one shape never reinforces another's mistake. A model imitating it learns
the mistake as the most likely answer there, so greedy accuracy after SFT stays well below 1 and RL from
the execution reward has something to fix. (A clean teacher reaches 1.0 by SFT alone and leaves RL nothing to
show.)
"""

from __future__ import annotations

import random
import re
from typing import Any

from examples.text2sql.make_data import TINY_TEMPLATES
from examples.text2sql.multi_agent import CHECKER_PROMPT, FEEDBACK_PROMPT
from examples.text2sql.sqltools import execution_reward

ERROR_RATE = 0.7
_MISTAKES = {  # template -> the systematic wrong query, by department id
    "tiny_count_proj": "SELECT COUNT(*) FROM projects",
    "tiny_max_salary": "SELECT MAX(salary) FROM projects WHERE dept_id = {d}",
}
MISTAKE_SHAPES = frozenset(_MISTAKES)
"""The two shapes (templates) the tiny demonstrator gets wrong ``ERROR_RATE`` of the time."""


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


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    return next((str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user"), "")


def answer(messages: list[dict[str, Any]], rng: random.Random) -> str:
    """``TeacherServer`` callback: answer the last user message."""
    return demonstrate(_last_user_text(messages), rng)


# The writer + checker pair on the full questions (``compare_policies.py``'s SFT warm start). The writer forgets
# the WHERE filter ``WRITER_ERROR_RATE`` of the time on the templates in ``CARELESS_TEMPLATES`` (the query runs
# and returns the wrong rows); after a reviewer's objection it writes the gold query. The checker replies OK to
# a right query and objects to a wrong one only ``CHECKER_CATCH_RATE`` of the time. Greedy imitation therefore
# writes the mistake on the careless templates and lets most wrong queries through: RL has both roles to fix.
WRITER_ERROR_RATE = 0.7
CHECKER_CATCH_RATE = 0.3
CARELESS_TEMPLATES = frozenset({"count_dept", "names_dept", "avg_salary_dept", "hired_in", "count_status",
                                "hours_project", "max_salary_title", "count_city"})
OBJECTION = "The query ignores a condition of the question."


def _prompt_pattern(template: str) -> re.Pattern[str]:
    """A regex matching ``template.format(...)``, each ``{field}`` a named group (the prompts are read back)."""
    pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>.*?)", re.escape(template))
    return re.compile(pattern, re.DOTALL)


_CHECK = _prompt_pattern(CHECKER_PROMPT)
_FEEDBACK = _prompt_pattern(FEEDBACK_PROMPT)


def forgetful(sql: str) -> str:
    """The writer's mistake: the query without its WHERE clause."""
    return re.sub(r" WHERE .*$", "", sql, flags=re.DOTALL)


class WriterCheckerDemonstrator:
    """``TeacherServer`` callback answering both roles' prompts for questions it knows (gold SQL by question)."""

    def __init__(self, questions: list[dict[str, Any]], *, catch_rate: float = CHECKER_CATCH_RATE) -> None:
        self.known = {q["question"]: q for q in questions}
        self.catch_rate = catch_rate

    def __call__(self, messages: list[dict[str, Any]], rng: random.Random) -> str:
        text = _last_user_text(messages)
        checked = _CHECK.fullmatch(text)
        if checked:  # the checker's prompt
            q = self.known.get(checked["question"])
            if q is None:
                return "OK"
            right = execution_reward(checked["sql"].strip(), q["sql"]) == 1.0
            return OBJECTION if not right and rng.random() < self.catch_rate else "OK"
        rejected = _FEEDBACK.fullmatch(text)
        q = self.known.get(rejected["question"] if rejected else text)
        if q is None:
            return ""
        sql = q["sql"]
        if not rejected and q["template"] in CARELESS_TEMPLATES and rng.random() < WRITER_ERROR_RATE:
            sql = forgetful(sql)
        return f"```sql\n{sql}\n```"
