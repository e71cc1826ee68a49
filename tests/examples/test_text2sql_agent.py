"""The text-to-SQL agents through the real pipeline: scripted OpenAI-compatible server for the agent
mechanics, then a tiny model under the Trainer (spans, rewards, transitions, an update)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fake_openai import FakeOpenAI

from examples._runtime import LLMSettings, serve_jsonl
from examples.text2sql import agent as t2s
from examples.text2sql import multi_agent
from examples.text2sql.sqltools import DATA_DIR, load_questions

GOLD = "SELECT COUNT(*) FROM projects WHERE status = 'active'"
TASK = {"question": "How many projects are active?", "sql": GOLD}


def _client(server: FakeOpenAI):
    return LLMSettings(server.base_url, "m", "k").client()


def test_agent_rewrites_after_an_error_and_earns_execution_reward():
    replies = iter(["SELECT nope FROM projects", f"```sql\n{GOLD};\n```"])
    with FakeOpenAI(reply=lambda body: next(replies)) as server:
        reward = t2s.episode(TASK, _client(server), "m", {"temperature": 0.0})
        second = server.requests[1].body
    assert reward == 1.0
    assert "no such column: nope" in second["messages"][-1]["content"]  # the error was shown to the model
    assert second["temperature"] == 0.0 and "CREATE TABLE employees" in second["messages"][0]["content"]


def test_agent_gives_up_after_max_tries_with_zero_reward():
    with FakeOpenAI(reply="I cannot write SQL.") as server:
        reward = t2s.episode(dict(TASK, max_tries=3), _client(server), "m", {})
        assert len(server.requests) == 3
    assert reward == 0.0


def test_agent_rejects_a_task_without_gold_sql():
    with pytest.raises(ValueError, match=r"task\['sql'\] must be a non-empty string, got None"):
        t2s.episode({"question": "q"}, None, "m", {})


def test_multi_agent_writer_rewrites_on_checker_feedback():
    def reply(body):
        text = body["messages"][-1]["content"]
        if text.startswith("You review SQL"):
            return "OK" if "'active'" in text else "It counts every project, not the active ones."
        if "reviewer rejected" in text:
            return GOLD
        return "SELECT COUNT(*) FROM projects"
    with FakeOpenAI(reply=reply) as server:
        reward = multi_agent.episode(dict(TASK, review_rounds=2), _client(server), "m", {})
        assert len(server.requests) == 4  # writer, checker (rejects), writer, checker (accepts)
    assert reward == 1.0


def test_multi_agent_roles_ask_for_their_own_models(monkeypatch):
    def reply(body):
        return "It is wrong." if body["messages"][-1]["content"].startswith("You review SQL") else GOLD
    with FakeOpenAI(reply=reply) as server:  # per-agent policies: each role's adapter, by name
        multi_agent.episode(TASK, _client(server), "base", {}, {"writer": "w-adapter", "checker": "c-adapter"})
        by_call = [r.body["model"] for r in server.requests]
        monkeypatch.setenv("SPANRL_MODEL_CHECKER", "c-env")  # a command agent: SPANRL_MODEL_<AGENT>
        multi_agent.episode(TASK, _client(server), "base", {})
        from_env = [r.body["model"] for r in server.requests[len(by_call):]]
    assert by_call == ["w-adapter", "c-adapter", "w-adapter"]
    assert from_env == ["base", "c-env", "base"]


def test_policy_comparison_scores_first_try_catches_and_final_success():
    from examples.text2sql.compare_policies import CompareConfig, score

    wrong = {"question": "How many projects are there?", "sql": "SELECT COUNT(*) FROM projects"}

    def reply(body):  # the writer always answers the active count; the checker rejects only for the other question
        text = body["messages"][-1]["content"]
        if text.startswith("You review SQL"):
            return "OK" if "active" in text.split("Query:")[0] else "Count every project."
        return "SELECT COUNT(*) FROM projects" if "reviewer rejected" in text else GOLD
    with FakeOpenAI(reply=reply) as server:
        scores = score(_client(server), {"writer": "w", "checker": "c"}, [TASK, wrong], CompareConfig(tries=1))
    assert scores == {"writer_first_try": 0.5, "checker_catch_rate": 1.0, "checker_false_alarms": 0.0,
                      "final_success": 1.0, "n": 2}


def test_command_line_agent_runs_one_rollout_from_the_environment():
    with FakeOpenAI(reply=GOLD) as server:
        env = {**os.environ, "SPANRL_TASK": json.dumps(TASK), "OPENAI_BASE_URL": server.base_url,
               "SPANRL_SAMPLING": json.dumps({"temperature": 0.5})}
        env.pop("SPANRL_AGENT_PROTOCOL", None)
        out = subprocess.run([sys.executable, str(t2s.__file__)], env=env, capture_output=True, text=True, timeout=60)
        assert server.requests[0].body["temperature"] == 0.5
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"reward": 1.0}
    missing = subprocess.run([sys.executable, str(t2s.__file__)],
                             env={k: v for k, v in env.items() if k != "SPANRL_TASK"},
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "SPANRL_TASK is not set" in missing.stderr


def test_jsonl_worker_answers_each_rollout_and_survives_a_bad_task():
    with FakeOpenAI(reply=GOLD) as server:
        lines = [json.dumps({"rollout_id": "r1", "task_id": "t1", "task": TASK, "base_url": server.base_url}),
                 json.dumps({"rollout_id": "r2", "task_id": "t2", "task": {"question": "q"},
                             "base_url": server.base_url})]
        out: list[str] = []

        class Sink:
            write = out.append

            def flush(self):
                pass

        serve_jsonl(t2s.episode, lines, Sink())
    answers = [json.loads(line) for line in out]
    assert answers[0] == {"spanrl_done": "r1", "reward": 1.0}
    assert answers[1]["spanrl_done"] == "r2" and "task['sql'] must be a non-empty string" in answers[1]["error"]


def _tiny_words() -> list[str]:
    return (DATA_DIR / "tiny_vocab.txt").read_text().split()


def _tiny_tasks(n: int) -> list[dict]:
    return [dict(q, prompt_style="tiny", max_tries=1) for q in load_questions("tiny_train")[:n]]


def _half_right(tasks: list[dict]) -> list[tuple[list[dict], str, str]]:
    """Priming examples: each task's gold SQL or a query that does not run ("SELECT"), odds ~1/2 each."""
    return [(t2s.first_messages(t["question"], "tiny"), t["sql"], "SELECT") for t in tasks]


def test_agent_trains_through_the_pipeline_on_a_tiny_model(pipeline):
    from training_checks import assert_trained

    tasks = _tiny_tasks(4)
    run = pipeline(agent_file=t2s.__file__, words=_tiny_words(), tasks=tasks, n_rollouts=8, prime=_half_right(tasks),
                   served_probe=t2s.first_messages(tasks[0]["question"], "tiny"))
    step = run.history[-1]
    assert step["rollouts_ok"] == 16 and step["rollouts_failed"] == 0
    assert step["transitions"] == 16 and step["policy_version"] == 1
    assert_trained(step, initial=run.model, checkpoint=run.checkpoint)
    rewards = run.sql("SELECT rollout_id, reward_value FROM spans WHERE name = 'spanrl.reward'")
    assert len({r["rollout_id"] for r in rewards}) == 16 and {r["reward_value"] for r in rewards} == {0.0, 1.0}
    tools = run.sql("SELECT count(*) AS n FROM spans WHERE operation_name = 'execute_tool' "
                    "AND json_extract_string(attributes, '$.\"gen_ai.tool.name\"') = 'run_sql'")
    assert tools[0]["n"] == 16  # one try each
    # the rollouts' calls (the served-policy probe after the reload is a call of no rollout)
    served = run.sql("SELECT count(*) AS n FROM spans WHERE kind = 'SERVER' AND len(completion_token_ids) > 0 "
                     "AND rollout_id LIKE '%-s1-%'")
    assert served[0]["n"] == 16


def test_multi_agent_trains_only_the_writer(pipeline):
    from spanrl.algorithms.transitions import load_transitions
    from spanrl.store import SpanStore
    from training_checks import assert_trained

    from examples.text2sql.sqltools import extract_sql, run_sql

    tasks = [dict(t, review_rounds=1) for t in _tiny_tasks(4)]
    # the writer half right; the checker taught to accept whichever of the two queries it is shown, so the
    # reward is the writer's first query's
    checker = [([{"role": "user", "content": multi_agent.CHECKER_PROMPT.format(
        question=t["question"], sql=extract_sql(sql), result=run_sql(extract_sql(sql)).preview())}], "OK", "OK")
        for t in tasks for sql in (t["sql"], "SELECT")]
    run = pipeline(agent_file=multi_agent.__file__, words=_tiny_words() + ["OK"], tasks=tasks, agent_name="writer",
                   n_rollouts=8, prime=_half_right(tasks) + checker)
    with SpanStore.open(run.db_path, read_only=True) as store:
        everything = load_transitions(store).transitions
        writer = load_transitions(store, agents=["writer"]).transitions
    agents = {t.agent for t in everything}
    assert agents == {"writer", "checker"}
    assert writer and {t.agent for t in writer} == {"writer"} and len(writer) < len(everything)
    assert run.history[-1]["transitions"] == len(writer)
    assert_trained(run.history[-1], initial=run.model, checkpoint=run.checkpoint)
