"""Step signals: tool spans shaped as the GenAI conventions write them (children of the agent's invoke_agent
span after the LLM call, ``gen_ai.tool.call.id`` naming a tool call of the call's output) through a real
collector into DuckDB, read back as per-call facts, turned into per-step rewards in ``step`` mode: advantages
worked out by hand. Bad configs are refused naming the field, the allowed values and the bad value."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_transitions_gigpo import H

from spanrl import semconv as sc
from spanrl.algorithms.credit import CreditConfig, LightningRL
from spanrl.algorithms.transitions import load_transitions
from spanrl.errors import ConfigError
from spanrl.store.decomposer import decompose
from spanrl.store.step_facts import CALL_COLUMNS, step_facts, tool_call_ids

SIGNALS = {"tool_error": -0.2, "nonzero_exit": -0.2, "denied": -0.1, "retry": -0.1}


def _said(*calls: tuple[str, str, dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant output with GenAI tool_call parts (id, tool, arguments)."""
    parts = [{"type": "tool_call", "id": i, "name": n, "arguments": a} for i, n, a in calls]
    return [{"role": "assistant", "parts": parts, "finish_reason": "tool_call"}]


def _tool(r: Any, parent: Any, start_ms: float, name: str, *, call_id: str | None = None, args: str | None = None,
          error: bool = False, events: tuple = (), **attributes: Any) -> None:
    attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: name, **attributes}
    if call_id is not None:
        attrs[sc.GEN_AI_TOOL_CALL_ID] = call_id
    if args is not None:
        attrs[sc.GEN_AI_TOOL_CALL_ARGUMENTS] = args
    H.Recorder.span(r.agent, f"execute_tool {name}", start_ns=H._ns(start_ms), end_ns=H._ns(start_ms + 4),
                    parent=parent, attributes=attrs, error=error, events=events)


def _deliver(collector: Any) -> None:
    """Task t1, four rollouts of two calls each, every one rewarded 1 at the end:

    a: call 0 runs ``make``, exit code 2 (status ERROR, error.type "2": one nonzero_exit, not also a
       tool_error); that tool span ends late, after call 1, and is still call 0's: its id is in call 0's output;
    b: call 0's ``delete_file`` is denied (the decision event, OpenAI-style tool_calls in its output);
    c: call 1 repeats call 0's search with the same arguments (other JSON whitespace), no call id (found by
       time), and it fails (status ERROR, error.type timeout): one retry and one tool_error at call 1;
    d: clean; a tool span before its first call fails (credits no call).

    Calls are labelled (``spanrl.label.good``, for the credit audit): the three with a signal are bad.
    """
    rec = H.Recorder()
    ask = [{"role": "user", "parts": [{"type": "text", "content": "build it"}]}]
    good, bad = {sc.LABEL_GOOD: True}, {sc.LABEL_GOOD: False}
    for rid in "abcd":
        r = H.Rollout(rec, rid, task_id="t1")
        root = r.root(0, 100)
        agent = r.invoke_agent("coder", root, 1, 99)
        if rid == "a":
            said = _said(("call_a0", "run_shell", {"cmd": "make"}))
            r.call(agent, 10, [1, 2], [5], messages=(ask, said), attributes=bad)
            r.call(agent, 30, [1, 2, 5, 6], [7], attributes=good)
            _tool(r, agent, 60, "run_shell", call_id="call_a0", args='{"cmd": "make"}', error=True,
                  **{sc.PROCESS_EXIT_CODE: 2, sc.ERROR_TYPE: "2"})
        elif rid == "b":
            out = [{"role": "assistant", "tool_calls": [{"id": "call_b0", "type": "function",
                                                         "function": {"name": "delete_file", "arguments": "{}"}}]}]
            r.call(agent, 10, [1, 2], [5], messages=(ask, out), attributes=bad)
            decision = (sc.GEN_AI_TOOL_CALL_DECISION, H._ns(21), {sc.GEN_AI_TOOL_CALL_DECISION_OUTCOME: "deny"})
            _tool(r, agent, 21, "delete_file", call_id="call_b0", args="{}", events=(decision,))
            r.call(agent, 30, [1, 2, 5, 6], [7], attributes=good)
        elif rid == "c":
            r.call(agent, 10, [1, 2], [5], messages=(ask, _said(("call_c0", "search", {"q": "x"}))), attributes=good)
            _tool(r, agent, 21, "search", call_id="call_c0", args='{"q": "x"}')
            r.call(agent, 30, [1, 2, 5, 6], [7], attributes=bad)
            _tool(r, agent, 41, "search", args='{"q":"x"}', error=True, **{sc.ERROR_TYPE: "timeout"})
        else:
            _tool(r, agent, 2, "setup", error=True, **{sc.ERROR_TYPE: "OSError"})
            r.call(agent, 10, [1, 2], [5], messages=(ask, _said(("call_d0", "search", {"q": "y"}))), attributes=good)
            _tool(r, agent, 21, "search", call_id="call_d0", args='{"q": "y"}')
            r.call(agent, 30, [1, 2, 5, 6], [7], attributes=good)
        r.reward(root, 90, 1.0)
    H.deliver(collector, rec.spans())


def _advantages(batch: Any) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {}
    for t in batch.transitions:
        got.setdefault(t.rollout_id, []).append(round(t.advantage, 6))
    return got


def test_the_store_gives_each_call_the_facts_of_the_tool_calls_it_issued(collector: Any) -> None:
    _deliver(collector)
    calls = decompose(collector.store, call_columns=CALL_COLUMNS).calls
    facts = step_facts(collector.store, calls)
    got = {(r["rollout_id"], r["step"]): {k: r[k] for k in ("tools", "tool_error", "nonzero_exit", "denied", "retry")
                                          if r[k]} for r in facts.to_pylist()}
    assert got == {
        ("a", 0): {"tools": 1, "nonzero_exit": 1},
        ("b", 0): {"tools": 1, "denied": 1},
        ("c", 0): {"tools": 1},
        ("c", 1): {"tools": 1, "tool_error": 1, "retry": 1},
        ("d", -1): {"tools": 1, "tool_error": 1},
        ("d", 0): {"tools": 1},
    }


def test_step_mode_adds_the_signals_as_per_step_rewards(collector: Any) -> None:
    _deliver(collector)
    plain = load_transitions(collector.store, credit=LightningRL(mode="step", scale_std=False))
    assert _advantages(plain) == {r: [0.0, 0.0] for r in "abcd"}  # every rollout earned 1: nothing to learn

    batch = load_transitions(collector.store, credit=LightningRL(mode="step", scale_std=False, step_signals=SIGNALS))
    # s: a0 -0.2 (exit 2), b0 -0.1 (denied), c1 -0.1 - 0.2 (retry, error); r = 1 after each call 1.
    # G (gamma 1) = a [0.8, 1], b [0.9, 1], c [0.7, 0.7], d [1, 1]
    # step 0 mean 0.85: [-0.05, 0.05, -0.15, 0.15]; step 1 mean 0.925: [0.075, 0.075, -0.225, 0.075]
    assert _advantages(batch) == {"a": [-0.05, 0.075], "b": [0.05, 0.075], "c": [-0.15, -0.225],
                                  "d": [0.15, 0.075]}
    assert {t.rollout_id: round(t.reward, 6) for t in batch.transitions if t.step == 0} == {
        "a": 0.8, "b": 0.9, "c": 0.7, "d": 1.0}
    assert batch.rewards_by_rollout == {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}  # the episode reward is untouched
    assert {k: v for k, v in batch.report.items() if "signal" in k} == {
        "step_signals_before_first_call": 1, "step_signal_tool_error": 1, "step_signal_nonzero_exit": 1,
        "step_signal_denied": 1, "step_signal_retry": 1}

    # gamma 0.5: a's call 0 gets -0.2 + 0.5 * 1 = 0.3; c's call 0 0.5 * 0.7 = 0.35; b 0.4, d 0.5: mean 0.3875
    half = load_transitions(collector.store, credit=LightningRL(mode="step", gamma=0.5, scale_std=False,
                                                                step_signals={"nonzero_exit": -0.2, "retry": -0.1,
                                                                              "tool_error": -0.2, "denied": -0.1}))
    assert [a[0] for a in _advantages(half).values()] == [-0.0875, 0.0125, -0.0375, 0.1125]


def test_a_tool_span_of_another_agent_is_that_agents_call_when_one_agent_is_trained(collector: Any) -> None:
    rec = H.Recorder()
    for rid in "xy":  # planner call 0, coder call 1, planner call 2, reward 1; x's coder tool fails after call 1
        r = H.Rollout(rec, rid, task_id="t1")
        root = r.root(0, 100)
        planner, coder = r.invoke_agent("planner", root, 1, 99), r.invoke_agent("coder", root, 25, 45)
        r.call(planner, 10, [1, 2], [5])
        r.call(coder, 30, [3], [4])
        if rid == "x":
            _tool(r, coder, 41, "run_shell", error=True)
        r.call(planner, 50, [1, 2, 5, 6], [7])
        r.reward(root, 90, 1.0)
    H.deliver(collector, rec.spans())
    batch = load_transitions(collector.store, agents=["planner"], credit=LightningRL(
        mode="step", gamma=0.5, scale_std=False, step_signals={"tool_error": -0.5}))
    # s_1 = -0.5 on x's coder call (not the planner's call 0 before it): G_0 = 0.5 * (-0.5 + 0.5 * 1) = 0 for x,
    # 0.25 for y (mean 0.125); G_2 = 1 for both. Given to planner's call 0 it would be -0.25: advantages -/+0.25.
    assert _advantages(batch) == {"x": [-0.125, 0.0], "y": [0.125, 0.0]}
    assert batch.report["step_signal_tool_error"] == 1


def test_signals_of_a_rollout_without_reward_keep_it_skipped(collector: Any) -> None:
    rec = H.Recorder()
    r = H.Rollout(rec, "e", task_id="t9")
    root = r.root(0, 100)
    r.call(root, 10, [1, 2], [5])
    _tool(r, root, 21, "run_shell", error=True)
    H.deliver(collector, rec.spans())
    batch = load_transitions(collector.store, credit=LightningRL(mode="step", step_signals={"tool_error": -1.0}))
    assert len(batch) == 0 and batch.report["skipped_no_reward"] == 1


def test_bad_step_signals_are_refused_naming_the_field() -> None:
    cases = [
        ({"tool_eror": -0.2}, "step", "step_signals: no signal 'tool_eror'; the signals are tool_error, nonzero_exit, "
                                      "denied, retry"),
        ({"retry": "low"}, "step", "step_signals.retry must be a finite number (a reward), got 'low'"),
        ({"retry": float("nan")}, "step", "step_signals.retry must be a finite number (a reward), got nan"),
        ({"denied": True}, "step", "step_signals.denied must be a finite number (a reward), got True"),
        ([-0.2], "step", "step_signals must be a mapping of tool_error, nonzero_exit, denied, retry to a reward, "
                         "got [-0.2]"),
        ({"retry": -0.1}, "identical", "step_signals needs mode 'step' or 'gae' (per-step rewards); mode "
                                       "'identical' reads only the episode reward: got step_signals={'retry': -0.1}"),
    ]
    for signals, mode, message in cases:
        with pytest.raises(ConfigError) as info:
            CreditConfig(mode=mode, step_signals=signals).validate()
        assert str(info.value) == message
    CreditConfig(mode="identical", step_signals={}).validate()  # empty: off, in any mode
    CreditConfig(mode="gae", baseline="none", step_signals={"retry": -0.1}).validate()


def test_tool_call_ids_read_both_message_shapes_and_ignore_bad_json() -> None:
    openai = [{"role": "assistant", "tool_calls": [{"id": "x1", "function": {"name": "f"}}]}]
    assert tool_call_ids(json.dumps(_said(("c1", "f", {}), ("c2", "g", {})))) == ["c1", "c2"]
    assert tool_call_ids(openai) == ["x1"]
    assert tool_call_ids("not json") == [] and tool_call_ids(None) == [] and tool_call_ids('{"a": 1}') == []


def test_gae_reads_the_signals_as_rewards_and_the_episode_reward_does_not_move() -> None:
    import numpy as np

    from spanrl.algorithms.credit import assign_credit

    # one rollout of 3 calls, reward 1 after call 2, a signal -0.5 at call 0, critic values 0:
    # A_t = sum_k (gamma lam)^(k - t) r_k with gamma lam = 0.5: [-0.5 + 0.25, 0.5, 1]
    common = dict(call_rollout=np.zeros(3, np.int64), call_step=np.arange(3), rollout_calls=np.array([3]),
                  rollout_group=np.array([0]), reward_rollout=np.array([0]), reward_step=np.array([2]),
                  reward_value=np.array([1.0]), reward_time_ns=np.array([0]), values=np.zeros(3),
                  signals=(np.array([0]), np.array([0]), np.array([-0.5])))
    off = CreditConfig(mode="gae", baseline="none", scale_std=False, gamma=1.0, lam=0.5)
    assert assign_credit(off, **common).advantages.tolist() == [0.25, 0.5, 1.0]  # not configured: not read
    on = CreditConfig(mode="gae", baseline="none", scale_std=False, gamma=1.0, lam=0.5,
                      step_signals={"tool_error": -0.5})
    result = assign_credit(on, **common)
    assert result.advantages.tolist() == [-0.25, 0.5, 1.0] and result.episode_reward.tolist() == [1.0]


def test_ppo_batches_read_the_signals_in_gae_and_value_every_call(collector: Any) -> None:
    from types import SimpleNamespace

    from spanrl.algorithms.transitions import load_training_batch

    class Critic:  # PPO's contract as load_training_batch reads it: a critic that values each call at 0
        needs_values = True
        tokenizer = None
        config = SimpleNamespace(gamma=1.0, lam=1.0, temperature=None)

        def value_map(self, states: Any) -> dict[tuple[str, int], float]:
            return {(t.rollout_id, t.step): 0.0 for t in states.transitions}

    _deliver(collector)
    batch = load_training_batch(collector.store, Critic(), credit=LightningRL(mode="step", step_signals=SIGNALS))
    # V = 0, gamma = lam = 1: A_t = sum_{k >= t} (r_k + s_k), the returns of the worked example, unbaselined
    assert _advantages(batch) == {"a": [0.8, 1.0], "b": [0.9, 1.0], "c": [0.7, 0.7], "d": [1.0, 1.0]}
