"""GiGPO's step groups from real span trees (through the real collector): load_transitions keys each call's
state by its ``spanrl.state.id`` (on the call's span, or the tool span before it), else the messages since the
last assistant turn, else the prompt's token ids (algorithms/gigpo.py), and computes the step term as
tests/algorithms/test_credit_gigpo.py does on arrays."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from spanrl import semconv as sc
from spanrl.algorithms.credit import CreditConfig
from spanrl.algorithms.transitions import load_transitions


def _helpers() -> Any:
    name = "spanrl_tests_decomposer_helpers"  # the span-tree helpers of the decomposer tests, loaded by path
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).resolve().parents[1] / "store" / "test_decomposer.py"
        )
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


H = _helpers()


def test_calls_after_the_same_tool_result_form_one_step_group(collector: Any) -> None:
    rec = H.Recorder()
    # four rollouts of one task: the first prompt is shared; a and b then saw one tool result, c and d another
    for rid, seen, reward in (("a", 9, 1.0), ("b", 9, 1.0), ("c", 8, 0.0), ("d", 8, 1.0)):
        r = H.Rollout(rec, rid, task_id="t1")
        root = r.root(0, 100)
        r.call(root, 10, [1, 2], [5])
        r.call(root, 30, [1, 2, 5, seen], [seen])
        r.reward(root, 90, reward)
    H.deliver(collector, rec.spans())

    batch = load_transitions(collector.store, credit=CreditConfig(scale_std=False, step_group_weight=1.0))
    got = {}
    for t in batch.transitions:
        got.setdefault(t.rollout_id, []).append(t.advantage)
    # episode term R - 0.75; step 0 (one state): the same again; step 1: {a, b} R = [1, 1] -> 0, {c, d} [0, 1] -> -/+0.5
    assert got == {"a": [pytest.approx(0.5), pytest.approx(0.25)], "b": [pytest.approx(0.5), pytest.approx(0.25)],
                   "c": [pytest.approx(-1.5), pytest.approx(-1.25)], "d": [pytest.approx(0.5), pytest.approx(0.75)]}
    assert batch.report["step_groups"] == 3
    plain = load_transitions(collector.store, credit=CreditConfig(scale_std=False))
    assert sorted(t.advantage for t in plain.transitions if t.rollout_id == "d") == [pytest.approx(0.25)] * 2


def _conversation(first: str, tool_result: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "2 + 3 * 2?"}, {"role": "assistant", "content": first},
            {"role": "tool", "content": tool_result}]


def _two_states(collector: Any, state_of: Any) -> dict[str, list[float]]:
    """a, b and c, d reach two states after their first call; rewards 1, 0, 1, 1. ``state_of(rollout, seen, r,
    root)`` records the second call (its prompt differs in every rollout: a free-text first reply)."""
    rec = H.Recorder()
    for n, (rid, seen, reward) in enumerate((("a", "8", 1.0), ("b", "8", 0.0), ("c", "9", 1.0), ("d", "9", 1.0))):
        r = H.Rollout(rec, rid, task_id="t1")
        root = r.root(0, 100)
        r.call(root, 10, [1, 2], [5], messages=([{"role": "user", "content": "2 + 3 * 2?"}], []))
        state_of(rid, seen, r, root, n)
        r.reward(root, 90, reward)
    H.deliver(collector, rec.spans())
    batch = load_transitions(collector.store, credit=CreditConfig(scale_std=False, step_group_weight=1.0))
    got: dict[str, list[float]] = {}
    for t in batch.transitions:
        got.setdefault(t.rollout_id, []).append(t.advantage)
    return got


# episode term R - 0.75; step 0 (one state for all): the same again; step 1: {a, b} -> +/-0.5, {c, d} -> 0
TWO_STATES = {"a": [pytest.approx(0.5), pytest.approx(0.75)], "b": [pytest.approx(-1.5), pytest.approx(-1.25)],
              "c": [pytest.approx(0.5), pytest.approx(0.25)], "d": [pytest.approx(0.5), pytest.approx(0.25)]}


def test_anchor_state_is_the_messages_since_the_last_assistant_turn(collector: Any) -> None:
    # each rollout's first reply is different free text, so no two second prompts are alike; what the
    # environment said since (the tool result) is the state
    def second(rid: str, seen: str, r: Any, root: Any, n: int) -> None:
        r.call(root, 30, [1, 2, 5, 40 + n, int(seen)], [7], messages=(_conversation(f"let me see ({rid})", seen), []))

    assert _two_states(collector, second) == TWO_STATES


def test_tool_call_ids_do_not_make_a_state(collector: Any) -> None:
    # what the instrumentation records for an OpenAI tool agent: each tool result under its call's id, which
    # the policy server draws at random (a uuid per call), so it differs in every rollout
    def second(rid: str, seen: str, r: Any, root: Any, n: int) -> None:
        history = [{"role": "user", "parts": [{"type": "text", "content": "2 + 3 * 2?"}]},
                   {"role": "assistant", "parts": [{"type": "tool_call", "id": f"call_{rid}", "name": "calc",
                                                    "arguments": {"x": "3 * 2"}}]},
                   {"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call_{rid}",
                                               "response": seen}]}]
        r.call(root, 30, [1, 2, 5, 40 + n, int(seen)], [7], messages=(history, []))

    assert _two_states(collector, second) == TWO_STATES


def test_the_policy_servers_messages_serve_when_the_agent_recorded_none(collector: Any) -> None:
    # an agent without content capture: only the policy server's span holds the input messages
    def second(rid: str, seen: str, r: Any, root: Any, n: int) -> None:
        conversation = json.dumps(_conversation(f"let me see ({rid})", seen))
        r.call(root, 30, [1, 2, 5, 40 + n, int(seen)], [7], server_attributes={sc.GEN_AI_INPUT_MESSAGES: conversation})

    assert _two_states(collector, second) == TWO_STATES


def test_anchor_state_is_the_state_id_of_the_tool_span_before_the_call(collector: Any) -> None:
    def second(rid: str, seen: str, r: Any, root: Any, n: int) -> None:
        tool = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "calc", sc.STATE_ID: f"s{seen}"}
        H.Recorder.span(r.agent, "execute_tool calc", start_ns=H._ns(21), end_ns=H._ns(25), parent=root,
                        attributes=tool)
        r.call(root, 30, [1, 2, 5, 40 + n], [7])  # no messages, prompts all different

    assert _two_states(collector, second) == TWO_STATES


def test_state_id_on_the_call_span_comes_first(collector: Any) -> None:
    def second(rid: str, seen: str, r: Any, root: Any, n: int) -> None:
        # the messages would make all four alike; the environment says otherwise
        r.call(root, 30, [1, 2, 5, 40 + n], [7], messages=(_conversation("ok", "same"), []),
               attributes={sc.STATE_ID: f"after {seen}"})

    assert _two_states(collector, second) == TWO_STATES


def test_a_tool_state_before_another_agents_call_is_not_the_selected_agents_next_state(collector: Any) -> None:
    """Selecting the solver leaves out the planner's call between the solver's two: the tool span that ended
    before the planner's call is the planner's state, never the solver's second call's (it took it when the
    previous call was looked for among the selected calls only)."""
    rec = H.Recorder()
    for n, (rid, seen, reward) in enumerate((("a", "8", 1.0), ("b", "8", 0.0), ("c", "9", 1.0), ("d", "9", 1.0))):
        r = H.Rollout(rec, rid, task_id="t1")
        root = r.root(0, 100)
        solver, planner = r.invoke_agent("solver", root, 1, 99), r.invoke_agent("planner", root, 26, 45)
        r.call(solver, 10, [1, 2], [5])  # step 0
        tool = {sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL, sc.GEN_AI_TOOL_NAME: "calc", sc.STATE_ID: f"s{seen}"}
        H.Recorder.span(r.agent, "execute_tool calc", start_ns=H._ns(21), end_ns=H._ns(25), parent=solver,
                        attributes=tool)
        r.call(planner, 30, [3, 4, 40 + n], [6])  # step 1: its state is s8 / s9
        r.call(solver, 50, [1, 2, 5, 50 + n], [7])  # step 2: no tool span since step 1: its prompt is its state
        r.reward(root, 90, reward)
    H.deliver(collector, rec.spans())
    batch = load_transitions(collector.store, agents=["solver"],
                             credit=CreditConfig(scale_std=False, step_group_weight=1.0))
    got: dict[str, list[float]] = {}
    for t in batch.transitions:
        got.setdefault(t.rollout_id, []).append(t.advantage)
    # episode term R - 0.75; step 0 (one state): the same again; step 2: four states of one call, + 0
    # (with s8 / s9 taken: a +0.5, b -0.5 more)
    assert got == {"a": [pytest.approx(0.5), pytest.approx(0.25)], "b": [pytest.approx(-1.5), pytest.approx(-0.75)],
                   "c": [pytest.approx(0.5), pytest.approx(0.25)], "d": [pytest.approx(0.5), pytest.approx(0.25)]}
