"""Multi-agent text-to-SQL: a *writer* drafts SQL (with the run-read-rewrite loop of agent.py) and a
*checker* reviews the query and its result; when the checker objects, the writer rewrites once more
with the checker's feedback. The reward is execution match of the writer's final query.

Each role runs inside ``spanrl.agent(NAME)``, so its LLM calls carry ``gen_ai.agent.name``. Training
selects the writer's calls only (the checker can be a different, frozen model or the same policy):
give the trainer ``agents=["writer"]`` (see the example's README). With one policy per agent
(``Trainer(policies={"writer": ..., "checker": ...})``) each role asks for its own adapter: the model named by
``SPANRL_MODEL_WRITER`` / ``SPANRL_MODEL_CHECKER`` (a callable agent: ``llm.model_for(name)``).

    SPANRL_TASK='{"question": "...", "sql": "..."}' opentelemetry-instrument python examples/text2sql/multi_agent.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import spanrl
from spanrl import env as spanrl_env
from examples._runtime import llm_settings, sampling_value, serve
from examples.text2sql.agent import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_MAX_TRIES,
    DEFAULT_TEMPERATURE,
    _check_task,
    write_sql,
)
from examples.text2sql.sqltools import SqlResult, execution_reward

WRITER = "writer"
CHECKER = "checker"
DEFAULT_REVIEW_ROUNDS = 1

CHECKER_PROMPT = (
    "You review SQL written for a question about a company database. Question: {question}\n"
    "Query: {sql}\nResult (first rows):\n{result}\n"
    "If the query answers the question, reply OK. Otherwise say what is wrong in one sentence."
)
FEEDBACK_PROMPT = "{question}\nA reviewer rejected the query {sql} : {feedback}\nWrite a corrected query."


def check_sql(client: Any, model: str, question: str, sql: str, result: SqlResult, *,
              temperature: float, max_tokens: int) -> tuple[bool, str]:
    """The checker's verdict: (accepted, its reply)."""
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user",
                   "content": CHECKER_PROMPT.format(question=question, sql=sql, result=result.preview())}],
        temperature=temperature, max_tokens=max_tokens)
    text = (reply.choices[0].message.content or "").strip()
    return text.upper().startswith("OK"), text


def episode(task: dict[str, Any], client: Any, model: str, sampling: dict[str, Any],
            models: dict[str, str] | None = None) -> float:
    """One rollout of writer + checker; emits and returns the reward of the writer's final query. ``models``:
    each role's model (per-agent policies); else ``SPANRL_MODEL_<ROLE>``, else ``model``."""
    _check_task(task)
    temperature = float(sampling_value(sampling, task, "temperature", DEFAULT_TEMPERATURE))
    max_tokens = int(sampling_value(sampling, task, "max_tokens", DEFAULT_MAX_TOKENS))
    style = task.get("prompt_style", "full")
    tries = int(task.get("max_tries", DEFAULT_MAX_TRIES))
    def role_model(role: str) -> str:
        return (models or {}).get(role) or spanrl_env.agent_model(role, model) or model

    checker_model = str(task.get("checker_model") or role_model(CHECKER))
    model = role_model(WRITER)
    question = task["question"]
    with spanrl.agent(WRITER):
        sql, result, _ = write_sql(client, model, question, max_tries=tries, prompt_style=style,
                                   temperature=temperature, max_tokens=max_tokens)
    for _ in range(int(task.get("review_rounds", DEFAULT_REVIEW_ROUNDS))):
        with spanrl.agent(CHECKER):
            accepted, feedback = check_sql(client, checker_model, question, sql, result,
                                           temperature=temperature, max_tokens=max_tokens)
        if accepted:
            break
        with spanrl.agent(WRITER):
            prompt = FEEDBACK_PROMPT.format(question=question, sql=sql, feedback=feedback)
            sql, result, _ = write_sql(client, model, prompt,
                                       max_tries=tries, prompt_style=style, temperature=temperature,

                                       max_tokens=max_tokens)
    reward = execution_reward(sql, task["sql"], executable_credit=float(task.get("executable_credit", 0.0)))
    spanrl.emit_reward(reward)
    return reward


def agent(task: dict[str, Any], llm: Any = None) -> None:
    """The trainer's callable form (the reward goes out as a span)."""
    settings = llm_settings(llm)
    episode(task, settings.client(), settings.model, settings.sampling, getattr(llm, "agent_models", None))


if __name__ == "__main__":
    sys.exit(serve(episode))
