"""The calculator task: tool, parsing, reward, the careless demonstrator and its OpenAI-compatible server."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

CALCULATOR = Path(__file__).resolve().parents[2] / "examples" / "calculator"
sys.path.insert(0, str(CALCULATOR))

import calculator  # noqa: E402
from demonstrator import DemonstratorServer  # noqa: E402


def test_parse_call_reads_the_tiny_models_tool_call() -> None:
    assert calculator.parse_call("<call> sub 30 7 </call>") == ("sub", [30, 7])
    assert calculator.parse_call("<call> add 1 2 </call> <eos>") == ("add", [1, 2])
    assert calculator.parse_call("sub 30 7") is None
    assert calculator.parse_call("<call> sub 30 </call>") == ("sub", [30])
    assert calculator.parse_call(None) is None


@pytest.mark.parametrize(
    ("op", "call", "expected"),
    [
        ("sub", ("sub", [30, 7]), 1.0),
        ("sub", ("sub", [7, 30]), 0.0),  # swapped operands: a different result
        ("add", ("add", [7, 30]), 1.0),  # swapped but the same result: the tool's answer is what counts
        ("sub", ("mul", [30, 7]), 0.0),
        ("sub", ("sub", [30]), 0.0),
        ("sub", ("pow", [30, 7]), 0.0),
        ("sub", None, 0.0),
    ],
)
def test_reward_is_one_when_the_tool_gives_the_answer(op: str, call: tuple[str, list[int]] | None,
                                                      expected: float) -> None:
    task = {"question": f"30 {op} 7", "op": op, "a": 30, "b": 7}
    assert calculator.reward(task, call) == expected


def test_div_by_zero_is_never_a_task_and_never_rewarded() -> None:
    tasks = calculator.make_tasks()
    assert len(tasks) == 4 * 50 * 50 - 50
    assert not [t for t in tasks if t["op"] == "div" and t["b"] == 0]
    assert calculator.reward({"op": "div", "a": 4, "b": 2}, ("div", [2, 0])) == 0.0


def test_split_tasks_is_disjoint_and_balanced() -> None:
    train, val = calculator.split_tasks(500, 100, seed=1)
    assert len(train) == 500 and len(val) == 100
    assert not {t["id"] for t in train} & {t["id"] for t in val}
    assert sorted({t["op"] for t in val}) == sorted(calculator.OPS)
    assert all(sum(t["op"] == op for t in val) == 25 for op in calculator.OPS)


def test_demonstrator_swaps_sub_and_div_about_seventy_percent_of_the_time() -> None:
    rng = random.Random(0)
    tasks = calculator.make_tasks(2000, seed=2)
    right = {op: [] for op in calculator.OPS}
    for task in tasks:
        call = calculator.parse_call(calculator.demonstrate(task["question"], rng))
        right[task["op"]].append(call == (task["op"], [task["a"], task["b"]]))
    assert all(right["add"]) and all(right["mul"])
    for op in ("sub", "div"):
        rate = sum(right[op]) / len(right[op])
        assert abs(rate - (1 - calculator.DEMO_ERROR_RATE)) < 0.06, (op, rate)


def test_demonstrator_server_answers_an_openai_client() -> None:
    openai = pytest.importorskip("openai")
    with DemonstratorServer(seed=0) as server:
        client = openai.OpenAI(base_url=f"{server.url}/rollouts/r-1/v1", api_key="x", max_retries=0)
        answers = {
            client.chat.completions.create(model="m",
                                           messages=[{"role": "user", "content": "3 add 4"}]).choices[0].message.content
            for _ in range(3)
        }
        assert answers == {"<call> add 3 4 </call>"}
        with pytest.raises(openai.BadRequestError, match="question must be 'A OP B'"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])


def test_demonstrator_answers_each_question_alike_whatever_order_the_requests_come_in() -> None:
    """The demo's SFT data must not depend on which agent's request reaches the server first (with one
    shared generator, held-out success after SFT ranged 0.55-0.80 between runs of one seed)."""
    import json
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    questions = [t["question"] for t in calculator.make_tasks(400, seed=3) if t["op"] in ("sub", "div")
                 and t["a"] != t["b"]]

    def ask(url: str, question: str) -> str:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": question}]}).encode()
        req = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.load(resp)["choices"][0]["message"]["content"]

    def answers(seed: int, order: list[str]) -> dict[str, str]:
        with DemonstratorServer(seed=seed) as server, ThreadPoolExecutor(8) as pool:
            return dict(zip(order, pool.map(lambda q: ask(server.url, q), order)))

    in_order, reversed_ = answers(0, questions), answers(0, questions[::-1])
    assert in_order == reversed_
    # "<call> sub B A </call>"
    swapped = sum(a.split()[2] != q.split()[0] for q, a in in_order.items()) / len(questions)
    assert abs(swapped - calculator.DEMO_ERROR_RATE) < 0.1, swapped
    assert answers(1, questions) != in_order  # the seed still matters
    with DemonstratorServer(seed=0) as server:  # one question asked again and again: independent draws
        again = [ask(server.url, "30 sub 7").split()[2] == "7" for _ in range(100)]
    assert abs(sum(again) / 100 - calculator.DEMO_ERROR_RATE) < 0.15, sum(again)


def test_the_agent_run_by_hand_needs_no_api_key(tmp_path: Path) -> None:
    """The README's by-hand command: a local server, no OPENAI_API_KEY set; the agent answers and prints."""
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SPANRL_", "OTEL_"))}
    with DemonstratorServer(seed=0) as server:
        env.update(SPANRL_TASK=json.dumps({"id": "add-2-3", "question": "2 add 3", "op": "add", "a": 2, "b": 3}),
                   OPENAI_BASE_URL=f"{server.url}/v1", OTEL_TRACES_EXPORTER="none")
        done = subprocess.run([sys.executable, str(CALCULATOR / "agent.py")], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1.0"  # the demonstrator never swaps add's operands
