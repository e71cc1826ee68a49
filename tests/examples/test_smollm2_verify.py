"""The calc-verify task (``spanrl.demo.smollm2.verify``, issue 52 item 3): the episode's rules and reward,
the shared state after a rejection, the labels, the held-out split and metrics; then a GRPO step of the real
agent against the real policy server on the tiny model, its spans in the real store read back by GiGPO's
state lookup, ``spanrl credit audit`` and the held-out metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spanrl.demo.smollm2.tools import SHOTS, held_out
from spanrl.demo.smollm2.verify import (RECOVERIES_SENT, RECOVERY_SHOTS, REJECTION, Episode, episode_reward, shots,
                                       split, state_id)
from spanrl.demo.smollm2.verify_metrics import summarize

TASK = {"id": "t", "key": "multiply:37:48", "question": "What is the product of 37 and 48?", "answer": "1776",
        "tool": "multiply"}


def _call(name: str, a: int, b: int, call_id: str = "call_x") -> list[dict[str, Any]]:
    return [{"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps({"a": a, "b": b})}}]


def _play(*replies: tuple[str | None, list[dict[str, Any]]]) -> tuple[Episode, list[Any]]:
    episode = Episode(TASK)
    return episode, [episode.step(text, calls) for text, calls in replies]


def test_episode_reward_decays_past_two_calls_and_is_zero_when_wrong() -> None:
    assert [episode_reward(True, c) for c in (1, 2, 3, 4)] == [1.0, 1.0, 0.6, pytest.approx(0.36)]
    assert episode_reward(False, 2) == 0.0


def test_right_first_time_with_the_tool_scores_one_and_labels_both_calls_good() -> None:
    episode, outcomes = _play((None, _call("multiply", 37, 48)), ("The answer is 1776.", []))
    assert episode.done and episode.right and episode.calls == 2 and episode.reward == 1.0
    assert [o.good for o in outcomes] == [True, True]
    assert outcomes[0].results[0][1] == "1776" and outcomes[0].state is not None and outcomes[1].state is None


def test_a_wrong_answer_is_rejected_and_dropped_so_every_rejected_rollout_shares_one_state() -> None:
    direct, (wrong,) = _play(("1448", []))
    via_tool, outcomes = _play((None, _call("add", 37, 48, "call_a")), ("85", []))
    assert wrong.rejected and outcomes[1].rejected and not wrong.good and not outcomes[0].good
    assert direct.messages == via_tool.messages == [*direct.start, {"role": "user", "content": REJECTION}]
    assert wrong.state == outcomes[1].state == state_id([{"role": "user", "content": TASK["question"]},
                                                         {"role": "user", "content": REJECTION}])
    # recovered: the tool, then the right answer; three calls in all
    tool = direct.step(None, _call("multiply", 48, 37))
    last = direct.step("1776", [])
    assert tool.good and last.good and direct.done and direct.rejections == 1
    assert direct.calls == 3 and direct.reward == pytest.approx(0.6)


def test_at_most_two_answers_and_four_calls() -> None:
    two_wrong, outcomes = _play(("12", []), ("13", []))
    assert two_wrong.done and two_wrong.calls == 2 and two_wrong.reward == 0.0 and outcomes[1].state is None
    tools, outcomes = _play(*[(None, _call("add", 1, 2))] * 4)
    assert tools.done and tools.calls == 4 and tools.reward == 0.0 and outcomes[-1].state is None
    with pytest.raises(RuntimeError, match="after the episode ended"):
        tools.step("1776", [])
    late, _ = _play((None, _call("add", 1, 2)), ("3", []), (None, _call("multiply", 37, 48)), ("1776", []))
    assert late.right and late.calls == 4 and late.reward == pytest.approx(0.36)


def test_the_state_is_the_conversation_not_the_call_ids() -> None:
    one, (a,) = _play((None, _call("multiply", 37, 48, "call_1")))
    two, (b,) = _play((None, _call("multiply", 37, 48, "call_2")))
    three, (c,) = _play((None, _call("multiply", 48, 37, "call_1")))
    assert a.state == b.state != c.state


def test_held_out_tasks_are_split_by_content_and_never_trained_on_by_any_seed() -> None:
    runs = [split(300, 200, seed=s) for s in range(4)]
    held = {t["key"] for _, val in runs for t in val}
    trained = {t["key"] for train, _ in runs for t in train}
    assert held and not held & trained and all(len(val) == 200 for _, val in runs)
    assert all(held_out(f"{k.split(':')[0]}:{min(k.split(':')[1:])}:{max(k.split(':')[1:])}") for k in held
               if not k.startswith("subtract"))
    # the recovery shots' triples (and a multiply's reverse) are never tasks
    assert not {"subtract:62:27", "multiply:19:36", "multiply:36:19", "add:45:38", "add:38:45"} & (held | trained)
    ids = [t["id"] for train, val in runs for t in train + val]
    assert len(ids) == len(set(ids)) and ids[0] == "calc-verify-train-0-0"


def test_the_shots_hold_the_tool_tasks_three_then_the_solved_recoveries() -> None:
    assert shots(0) == SHOTS and len(shots(2)) == len(SHOTS) + 2 * 5  # question, rejection, call, result, answer
    assert shots(2)[len(SHOTS) + 5:][:3] == [{"role": "user", "content": "What is 19 * 36?"},
                                             {"role": "user", "content": REJECTION}, RECOVERY_SHOTS[1][2]]
    assert RECOVERY_SHOTS[1][-1] == {"role": "assistant", "content": "684"}
    assert Episode(TASK).shots == shots(RECOVERIES_SENT)  # what the agent sends
    assert shots(3)[-5:-3] == [{"role": "user", "content": "How much is 45 plus 38?"},  # a task's phrasing
                               {"role": "user", "content": REJECTION}]
    assert RECOVERY_SHOTS[2][-1] == {"role": "assistant", "content": "83"}
    with pytest.raises(ValueError, match=r"^recovery must be 0 to 3 \(solved recoveries\), got 4$"):
        shots(4)


def test_metrics_hand_computed() -> None:
    # right first try; rejected then right in 3 calls; right in 3 calls with no rejection (two tool calls);
    # rejected and wrong
    got = summarize([(1.0, 2, 0), (0.6, 3, 1), (0.6, 3, 0), (0.0, 2, 1)])
    assert got == {"episodes": 4, "first_try": 0.25, "final_success": 0.75, "calls_per_episode": 2.5,
                   "recovery_rate": 0.5}
    assert summarize([(1.0, 2, 0)])["recovery_rate"] is None


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """One GRPO step (a group of 4) and the held-out metrics before and after on 3 tasks: the real agent,
    policy server, collector and store, the tiny model standing in for SmolLM2 (it answers wrong words)."""
    from spanrl.demo.smollm2.verify_run import VerifyConfig, run
    from spanrl.demo.tiny import build_tiny_model

    tmp = tmp_path_factory.mktemp("verify")
    words = ["<call>", "</call>", "add", "subtract", "multiply", "1776", "37", "48", "That", "answer"]
    model = build_tiny_model(tmp / "model", words=words, hidden_size=32, num_layers=1, num_heads=2,
                             intermediate_size=64)
    cfg = VerifyConfig.quick(model=str(model), output_dir=str(tmp / "run"), n_val=3, max_tokens=6, threads=1,
                             progress=False)
    return run(cfg), tmp / "run"


def test_a_tiny_run_reports_the_held_out_metrics(tiny_run: tuple[dict[str, Any], Path]) -> None:
    result, out = tiny_run
    assert result["steps"] == 1 and result["rollouts"] == 4 and result["n_val"] == 3
    assert json.loads((out / "result.json").read_text())["after"] == result["after"]
    for figures in (result["before"], result["after"]):
        assert figures["episodes"] == 3 and 1.0 <= figures["calls_per_episode"] <= 4.0
        assert 0.0 <= figures["first_try"] <= figures["final_success"] <= 1.0


def test_every_call_is_labelled_and_rejected_rollouts_share_the_state_after_the_rejection(
        tiny_run: tuple[dict[str, Any], Path]) -> None:
    from spanrl.algorithms.call_facts import ID_COLUMNS, call_facts
    from spanrl.demo.smollm2.verify import CHECK_TOOL
    from spanrl.store import SpanStore
    from spanrl.store.decomposer import Selection, decompose

    _, out = tiny_run
    with SpanStore.open(out / "spans.duckdb", read_only=True) as store:
        calls = decompose(store, Selection(), call_columns=("rollout_id", "step", *ID_COLUMNS)).calls
        facts = call_facts(store, calls)  # GiGPO's lookup: a call's own span, else the tool span before it
        rejected = {r["rollout_id"] for r in store.sql(
            f"SELECT DISTINCT rollout_id FROM spans WHERE name = 'execute_tool {CHECK_TOOL}'").to_pylist()}
        task_of = {r["rollout_id"]: r["task_id"] for r in store.sql("SELECT rollout_id, task_id FROM rollouts")
                   .to_pylist()}
    rollouts = calls.column("rollout_id").to_pylist()
    assert len(set(rollouts)) == 4 + 3 + 3 and None not in facts.label  # train, both evaluations; all labelled
    assert all(rollouts.count(r) <= 4 for r in set(rollouts))
    assert rejected, "the tiny model answers wrong: some rollout must have been rejected"
    train, val = split(8, 3, seed=0)
    shared = {t["id"]: state_id([{"role": "user", "content": t["question"]}, {"role": "user", "content": REJECTION}])
              for t in train + val}
    after = {}  # rollout -> the states of its calls that observed a rejection of its task
    for rollout, state in zip(rollouts, facts.state):
        if state == shared[task_of[rollout]]:
            after.setdefault(rollout, []).append(state)
    assert set(after) == rejected and all(len(states) == 1 for states in after.values()), (after, rejected)


def test_credit_audit_reads_every_label(tiny_run: tuple[dict[str, Any], Path]) -> None:
    _, out = tiny_run
    done = subprocess.run([sys.executable, "-m", "spanrl", "credit", "audit", str(out), "--mode", "train",
                           "--config", "mode=identical", "--config",
                           "mode=identical,step_group_weight=1,step_gamma=0.9"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    head = done.stdout.splitlines()[0]  # "credit audit: N calls, N labelled (g good, b bad); ..."
    calls, labelled = head.split(": ")[1].split(", ")[:2]
    assert int(calls.split()[0]) == int(labelled.split()[0]) >= 4, done.stdout


def test_the_example_command_takes_the_task_and_says_a_bad_setting_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from examples.smollm2.agentic import TASKS, main
    from spanrl.demo.smollm2.verify_run import VerifyConfig

    assert TASKS["calc-verify"] is VerifyConfig and VerifyConfig().n_val == 200
    assert main(["--task", "calc-verify", "--steps", "-1", "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.splitlines() == ["agentic.py: error: steps must be an integer >= 0, got -1"]
    assert not (tmp_path / "run").exists()
