"""The search-QA and LangChain agents: local BM25 search and answer reward, the agent loops against a
scripted OpenAI-compatible server, and each agent through the real pipeline on a tiny model."""

from __future__ import annotations

import pytest
from fake_openai import FakeOpenAI

from examples._runtime import LLMSettings
from examples.langchain_agent import agent as lc_agent
from examples.search_qa import agent as sq_agent
from examples.search_qa import make_data
from examples.search_qa.search import DATA_DIR, BM25Index, answer_reward, default_index, load_questions

TASK = {"question": "On which river does Ashfenwick lie?", "answer": "Esk"}


def _reply(body):
    """Search first, then answer from what the search returned."""
    last = body["messages"][-1]
    if last["role"] == "tool" or "Search results" in str(last.get("content")):
        results = str(last["content"])
        river = results.split("on the river ", 1)[1].split(".", 1)[0]
        return f"answer: {river}"
    return "search: Ashfenwick river"


def test_make_data_reproduces_committed_files(tmp_path):
    make_data.main(tmp_path)
    for name in ("corpus.jsonl", "train.jsonl", "val.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA_DIR / name).read_bytes(), name
    train, val = load_questions("train"), load_questions("val")
    assert len(train) + len(val) == 240 and not {q["doc_id"] for q in train} & {q["doc_id"] for q in val}


def test_bm25_finds_the_document_of_every_question():
    index = default_index()
    questions = load_questions("train") + load_questions("val")
    assert all(index.search(q["question"], 1)[0].doc_id == q["doc_id"] for q in questions)
    assert index.search("zzz unknown words") == []
    with pytest.raises(ValueError, match="k must be >= 1"):
        index.search("Esk", 0)
    with pytest.raises(ValueError, match="at least one document"):
        BM25Index([])


@pytest.mark.parametrize(
    ("prediction", "gold", "reward"),
    [("Esk", "Esk", 1.0), ("the Esk.", "esk", 1.0), ("river Esk", "Esk", pytest.approx(2 / 3)),
     ("Wye", "Esk", 0.0), ("", "Esk", 0.0)],
)
def test_answer_reward(prediction, gold, reward):
    assert answer_reward(prediction, gold) == reward


@pytest.mark.parametrize("episode", [sq_agent.episode, lc_agent.episode], ids=["openai", "langchain"])
def test_agent_searches_then_answers(episode):
    with FakeOpenAI(reply=_reply) as server:
        reward = episode(TASK, LLMSettings(server.base_url, "m", "k").client(), "m", {"temperature": 0.0})
        bodies = [r.body for r in server.requests]
    assert reward == 1.0
    assert len(bodies) == 2 and bodies[0]["tools"][0]["function"]["name"] == "search"
    assert "Ashfenwick" in str(bodies[1]["messages"][-1]["content"])  # the search result went back to the model


def test_agent_without_an_answer_in_time_earns_zero():
    with FakeOpenAI(reply="search: nothing useful") as server:
        reward = sq_agent.episode(dict(TASK, max_steps=2), LLMSettings(server.base_url, "m", "k").client(), "m", {})
        assert len(server.requests) == 2
    assert reward == 0.0


def _tiny_words() -> list[str]:
    words = {"search:", "answer:"}
    for q in load_questions("train")[:20]:
        words.update(q["question"].split() + q["answer"].split())
    return sorted(words)


@pytest.mark.parametrize("agent_module", [sq_agent, lc_agent], ids=["openai", "langchain"])
def test_agent_trains_through_the_pipeline_on_a_tiny_model(pipeline, agent_module):
    from training_checks import assert_trained

    tasks = [dict(q, max_steps=2) for q in load_questions("train")[:4]]
    # the right answer or another task's (token F1 0) with odds ~1/2 each
    prime = [([{"role": "system", "content": sq_agent.SYSTEM_PROMPT}, {"role": "user", "content": t["question"]}],
              f"answer: {t['answer']}", f"answer: {tasks[(i + 1) % len(tasks)]['answer']}")
             for i, t in enumerate(tasks)]
    run = pipeline(agent_file=agent_module.__file__, words=_tiny_words(), tasks=tasks, max_tokens=6, n_rollouts=8,
                   prime=prime, served_probe=prime[0][0])
    step = run.history[-1]
    assert step["rollouts_ok"] == 16 and step["rollouts_failed"] == 0
    assert step["transitions"] >= 16 and step["policy_version"] == 1
    assert_trained(step, initial=run.model, checkpoint=run.checkpoint)
    rewards = run.sql("SELECT DISTINCT rollout_id FROM spans WHERE name = 'spanrl.reward'")
    assert len(rewards) == 16
    clients = run.sql("SELECT count(*) AS n FROM spans WHERE kind = 'CLIENT' AND operation_name = 'chat'")
    assert clients[0]["n"] >= 16  # the openai instrumentor traced the agent's calls, LangChain's included
