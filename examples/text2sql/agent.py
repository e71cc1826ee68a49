"""Text-to-SQL agent: writes SQL for a question, runs it on the SQLite database, reads the error and
rewrites (up to 3 tries); the reward is execution match with the gold query (see sqltools.py).

A plain openai-client program. The only spanrl line is ``spanrl.emit_reward``; everything else is traced
by the standard OpenAI instrumentor. Two ways to run it:

    # as a command line, once per rollout (the trainer sets SPANRL_TASK, OPENAI_BASE_URL, OTEL_*):
    SPANRL_TASK='{"question": "How many projects are active?",
                  "sql": "SELECT COUNT(*) FROM projects WHERE status = '"'"'active'"'"'"}' \

        OPENAI_BASE_URL=http://127.0.0.1:8000/v1 opentelemetry-instrument python examples/text2sql/agent.py

    # as a Python callable agent(task, llm), llm carrying base_url, model and sampling:
    spanrl.Trainer(agent=examples.text2sql.agent.agent, ...)
    # or as a long-lived worker: SPANRL_AGENT_PROTOCOL=jsonl (see examples/_runtime.py)

Task fields: ``question``, ``sql`` (gold), optional ``max_tries`` (default 3), ``prompt_style``
(``full``: system prompt with the schema; ``tiny``: the bare question, for a word-level tiny model),
``executable_credit`` (reward for SQL that runs but is wrong; default 0.0), ``temperature``,
``max_tokens`` (the trainer's sampling settings, when given, win over the task's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opentelemetry import trace

import spanrl
from examples._runtime import llm_settings, sampling_value, serve
from examples.text2sql.sqltools import DB_PATH, SqlResult, execution_reward, extract_sql, run_sql, schema_text
from spanrl import semconv

DEFAULT_MAX_TRIES = 3
DEFAULT_MAX_TOKENS = 128
DEFAULT_TEMPERATURE = 1.0
TOOL_NAME = "run_sql"

SYSTEM_PROMPT = (
    "You translate questions about a company database into one SQLite query.\n"
    "Schema:\n{schema}\n"
    "Reply with the query only, in a ```sql block."
)
RETRY_PROMPT = "The query failed: {error}\nWrite a corrected query."

_tracer = trace.get_tracer("examples.text2sql")


def run_sql_tool(sql: str, db_path: Path = DB_PATH) -> SqlResult:
    """The agent's tool, traced as an ``execute_tool run_sql`` span (GenAI semantic conventions)."""
    with _tracer.start_as_current_span(f"{semconv.OP_EXECUTE_TOOL} {TOOL_NAME}") as span:
        span.set_attribute(semconv.GEN_AI_OPERATION_NAME, semconv.OP_EXECUTE_TOOL)
        span.set_attribute(semconv.GEN_AI_TOOL_NAME, TOOL_NAME)
        span.set_attribute(semconv.GEN_AI_TOOL_CALL_ARGUMENTS, json.dumps({"sql": sql}))
        result = run_sql(sql, db_path)
        span.set_attribute(semconv.GEN_AI_TOOL_CALL_RESULT, result.preview())
        if not result.ok:
            span.set_status(trace.Status(trace.StatusCode.ERROR, result.error))
        return result


def first_messages(question: str, prompt_style: str) -> list[dict[str, str]]:
    """The opening conversation: schema + question (``full``) or the bare question (``tiny``)."""
    if prompt_style == "tiny":
        return [{"role": "user", "content": question}]
    if prompt_style == "full":
        return [{"role": "system", "content": SYSTEM_PROMPT.format(schema=schema_text())},
                {"role": "user", "content": question}]
    raise ValueError(f"prompt_style must be 'full' or 'tiny', got {prompt_style!r}")


def write_sql(client: Any, model: str, question: str, *, max_tries: int = DEFAULT_MAX_TRIES,
              prompt_style: str = "full", temperature: float = DEFAULT_TEMPERATURE,
              max_tokens: int = DEFAULT_MAX_TOKENS) -> tuple[str, SqlResult, int]:
    """Ask for SQL, run it, feed back the error and retry. Returns (sql, result, tries used)."""
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries!r}")
    messages = first_messages(question, prompt_style)
    sql, result = "", SqlResult(None, "no query written")
    for attempt in range(1, max_tries + 1):
        reply = client.chat.completions.create(model=model, messages=messages, temperature=temperature,
                                               max_tokens=max_tokens)
        text = reply.choices[0].message.content or ""
        sql = extract_sql(text)
        result = run_sql_tool(sql)
        if result.ok:
            return sql, result, attempt
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": RETRY_PROMPT.format(error=result.error)}]
    return sql, result, max_tries


def _check_task(task: dict[str, Any]) -> None:
    for name in ("question", "sql"):
        if not isinstance(task.get(name), str) or not task[name].strip():
            raise ValueError(f"task[{name!r}] must be a non-empty string, got {task.get(name)!r}")


def episode(task: dict[str, Any], client: Any, model: str, sampling: dict[str, Any]) -> float:
    """One rollout: answer ``task['question']``; emit and return the execution-match reward."""
    _check_task(task)
    sql, _, _ = write_sql(client, model, task["question"],
                          max_tries=int(task.get("max_tries", DEFAULT_MAX_TRIES)),
                          prompt_style=task.get("prompt_style", "full"),
                          temperature=float(sampling_value(sampling, task, "temperature", DEFAULT_TEMPERATURE)),
                          max_tokens=int(sampling_value(sampling, task, "max_tokens", DEFAULT_MAX_TOKENS)))
    reward = execution_reward(sql, task["sql"], executable_credit=float(task.get("executable_credit", 0.0)))
    spanrl.emit_reward(reward)
    return reward


def agent(task: dict[str, Any], llm: Any = None) -> None:
    """The trainer's callable form: ``llm`` carries base_url, model and sampling. The reward goes out
    as a span (returning it too would make the trainer emit it a second time)."""
    settings = llm_settings(llm)
    episode(task, settings.client(), settings.model, settings.sampling)


if __name__ == "__main__":
    sys.exit(serve(episode))
