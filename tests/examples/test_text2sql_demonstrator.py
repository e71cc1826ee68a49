"""The writer + checker demonstrator (``compare_policies.py``'s SFT warm start) as the agent sees it: over real
HTTP through the scripted chat server, both roles answered, the mistakes at their stated rates."""

from __future__ import annotations

import random

from examples._runtime import LLMSettings
from examples._teacher import TeacherServer
from examples.text2sql import demonstrator as d
from examples.text2sql import multi_agent
from examples.text2sql.agent import first_messages
from examples.text2sql.sqltools import execution_reward, extract_sql, load_questions

QUESTIONS = [q for q in load_questions("train") if q["difficulty"] <= 2]
CARELESS = next(q for q in QUESTIONS if q["template"] in d.CARELESS_TEMPLATES)
CAREFUL = next(q for q in QUESTIONS if q["template"] not in d.CARELESS_TEMPLATES)


def _checker_prompt(q: dict, sql: str) -> list[dict]:
    content = multi_agent.CHECKER_PROMPT.format(question=q["question"], sql=sql, result="(1,)")
    return [{"role": "user", "content": content}]


def test_episodes_over_http_earn_what_the_demonstrator_writes():
    teacher = d.WriterCheckerDemonstrator(QUESTIONS)
    with TeacherServer(teacher, seed=0) as server:
        client = LLMSettings(server.url + "/v1", "m", "k").client()
        careful = [multi_agent.episode(dict(CAREFUL), client, "m", {"temperature": 1.0}) for _ in range(5)]
        careless = [multi_agent.episode(dict(CARELESS), client, "m", {"temperature": 1.0}) for _ in range(40)]
    assert careful == [1.0] * 5  # gold first time, the checker lets it through
    # wrong 70% of the time, caught (then rewritten right) 30% of those: ~0.3 + 0.7 * 0.3 = 0.51 right
    assert 0.25 <= sum(careless) / len(careless) <= 0.8


def test_the_writer_forgets_the_filter_on_careless_templates_only():
    teacher, rng = d.WriterCheckerDemonstrator(QUESTIONS), random.Random(0)
    first = [extract_sql(teacher(first_messages(CARELESS["question"], "full"), rng)) for _ in range(200)]
    wrong = sum(execution_reward(reply, CARELESS["sql"]) == 0.0 for reply in first)
    assert abs(wrong / 200 - d.WRITER_ERROR_RATE) < 0.1
    assert all("WHERE" not in r for r in first if execution_reward(r, CARELESS["sql"]) == 0.0)  # runs, wrong rows
    assert {teacher(first_messages(CAREFUL["question"], "full"), rng) for _ in range(20)} == {
        f"```sql\n{CAREFUL['sql']}\n```"}
    rejected = multi_agent.FEEDBACK_PROMPT.format(question=CARELESS["question"], sql="SELECT 1", feedback=d.OBJECTION)
    rewrite = extract_sql(teacher([{"role": "user", "content": rejected}], rng))
    assert execution_reward(rewrite, CARELESS["sql"]) == 1.0


def test_the_checker_passes_right_queries_and_catches_some_wrong_ones():
    teacher, rng = d.WriterCheckerDemonstrator(QUESTIONS), random.Random(0)
    assert {teacher(_checker_prompt(CARELESS, CARELESS["sql"]), rng) for _ in range(50)} == {"OK"}
    verdicts = [teacher(_checker_prompt(CARELESS, d.forgetful(CARELESS["sql"])), rng) for _ in range(300)]
    assert set(verdicts) == {"OK", d.OBJECTION}
    assert abs(verdicts.count(d.OBJECTION) / 300 - d.CHECKER_CATCH_RATE) < 0.08


def test_a_teacher_seeded_by_rollout_gives_each_rollout_its_answer_whatever_the_order():
    """``seed_by_rollout``: the answer to a rollout's request depends on the rollout (its id less the run tag),
    not on when it arrived, so a seeded run's SFT data pairs the same rollouts with the same answers."""
    import json
    import urllib.request

    def ask(server: TeacherServer, rollout: str) -> str:
        body = json.dumps({"messages": [{"role": "user", "content": "q"}]}).encode()
        url = f"{server.url}/rollouts/{rollout}/v1/chat/completions"
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())["choices"][0]["message"]["content"]

    def draw(messages: list, rng: random.Random) -> str:
        return str(rng.random())

    indices = list(range(12))
    with TeacherServer(draw, seed=0, seed_by_rollout=True) as first, \
            TeacherServer(draw, seed=0, seed_by_rollout=True) as second:
        forward = {i: ask(first, f"tag1-s0-{i}-a0") for i in indices}
        backward = {i: ask(second, f"tag2-s0-{i}-a0") for i in reversed(indices)}
        assert forward == backward and len(set(forward.values())) == len(indices)
        assert ask(first, "tag1-s0-0-a1") != forward[0]  # a retry draws anew
    with TeacherServer(draw, seed=0) as one, TeacherServer(draw, seed=0) as other:  # default: by arrival
        in_order = [ask(one, f"tag3-s0-{i}-a0") for i in indices]
        assert [ask(other, f"tag4-s0-{i}-a0") for i in reversed(indices)] == in_order  # the n-th gets the n-th
