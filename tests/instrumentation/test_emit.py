"""The emit API on a real SDK provider: span shapes, bad values, exceptions passing through."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

import spanrl
from spanrl import semconv


def test_emit_reward_number_is_child_of_current_span(spans):
    with trace.get_tracer("t").start_as_current_span("step") as step:
        spanrl.emit_reward(0.7)
    reward = spans.one(semconv.REWARD_SPAN_NAME)
    assert reward.parent.span_id == step.get_span_context().span_id
    assert reward.attributes[semconv.REWARD_VALUE] == 0.7
    assert reward.attributes[semconv.REWARD_NAME] == "reward"
    assert reward.attributes[semconv.GEN_AI_EVALUATION_SCORE_VALUE] == 0.7
    assert reward.attributes[semconv.GEN_AI_EVALUATION_NAME] == "reward"
    assert reward.status.status_code == StatusCode.UNSET


def test_emit_reward_dict_emits_one_span_per_name(spans):
    spanrl.emit_reward({"correct": 1, "format": 0.25}, explanation="checked")
    rewards = {s.attributes[semconv.REWARD_NAME]: s for s in spans.named(semconv.REWARD_SPAN_NAME)}
    assert set(rewards) == {"correct", "format"}
    assert rewards["correct"].attributes[semconv.REWARD_VALUE] == 1.0
    assert rewards["format"].attributes[semconv.GEN_AI_EVALUATION_SCORE_VALUE] == 0.25
    assert rewards["format"].attributes[semconv.GEN_AI_EVALUATION_EXPLANATION] == "checked"


@pytest.mark.parametrize("bad", ["high", float("nan"), float("inf"), None, [1.0]])
def test_emit_reward_bad_value_warns_and_span_says_why(spans, caplog, bad):
    with caplog.at_level(logging.WARNING, logger="spanrl.instrumentation"):
        spanrl.emit_reward(bad, name="score")  # must not raise
    reward = spans.one(semconv.REWARD_SPAN_NAME)
    assert semconv.REWARD_VALUE not in reward.attributes
    assert semconv.GEN_AI_EVALUATION_SCORE_VALUE not in reward.attributes
    error = reward.attributes[semconv.EMIT_ERROR]
    assert "'score'" in error and repr(bad) in error
    assert reward.status.status_code == StatusCode.ERROR
    assert repr(bad) in caplog.text


def test_emit_reward_bool_counts_as_zero_or_one(spans):
    spanrl.emit_reward({"solved": True, "timeout": False})
    values = {s.attributes[semconv.REWARD_NAME]: s.attributes[semconv.REWARD_VALUE] for s in spans.all()}
    assert values == {"solved": 1.0, "timeout": 0.0}


def test_emit_reward_bad_attribute_is_dropped_and_named(spans):
    spanrl.emit_reward(1.0, attributes={"ok": "yes", "bad": object()})
    reward = spans.one(semconv.REWARD_SPAN_NAME)
    assert reward.attributes["ok"] == "yes" and "bad" not in reward.attributes
    assert "'bad'" in reward.attributes[semconv.EMIT_ERROR]
    assert reward.attributes[semconv.REWARD_VALUE] == 1.0


def test_emit_observation_is_event_on_current_span(spans):
    with trace.get_tracer("t").start_as_current_span("step"):
        spanrl.emit_observation({"board": [1, 2]})
    step = spans.one("step")
    (event,) = step.events
    assert event.name == semconv.OBSERVATION_EVENT
    assert json.loads(event.attributes[semconv.OBSERVATION_CONTENT]) == {"board": [1, 2]}


def test_emit_observation_without_current_span_gets_its_own(spans):
    spanrl.emit_observation("the door is locked")
    span = spans.one(semconv.OBSERVATION_EVENT)
    assert span.events[0].attributes[semconv.OBSERVATION_CONTENT] == "the door is locked"


def test_emit_tool_call_is_execute_tool_span(spans):
    spanrl.emit_tool_call("calculator", {"op": "add", "a": 2, "b": 3}, 5, call_id="call_1")
    span = spans.one("execute_tool calculator")
    assert span.attributes[semconv.GEN_AI_OPERATION_NAME] == semconv.OP_EXECUTE_TOOL
    assert span.attributes[semconv.GEN_AI_TOOL_NAME] == "calculator"
    assert json.loads(span.attributes[semconv.GEN_AI_TOOL_CALL_ARGUMENTS]) == {"op": "add", "a": 2, "b": 3}
    assert span.attributes[semconv.GEN_AI_TOOL_CALL_RESULT] == "5"
    assert span.attributes[semconv.GEN_AI_TOOL_CALL_ID] == "call_1"


def test_emit_tool_call_error_and_bad_name(spans):
    spanrl.emit_tool_call("", "x", None, error=ZeroDivisionError("division by zero"))
    span = spans.one("execute_tool unknown")
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "ZeroDivisionError"
    assert "name must be a non-empty string" in span.attributes[semconv.EMIT_ERROR]


def test_emit_prompt_response_make_one_llm_span(spans):
    call = spanrl.emit_prompt(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}],
        model="tiny",
        prompt_token_ids=[1, 2, 3],
    )
    spanrl.emit_response(
        "4",
        call=call,
        response_id="r-1",
        input_tokens=3,
        output_tokens=1,
        completion_token_ids=[7],
        logprobs=[-0.5],
    )
    span = spans.one("chat tiny")
    assert span.kind == SpanKind.CLIENT
    attrs = span.attributes
    assert attrs[semconv.GEN_AI_OPERATION_NAME] == "chat"
    assert attrs[semconv.GEN_AI_REQUEST_MODEL] == "tiny"
    assert json.loads(attrs[semconv.GEN_AI_INPUT_MESSAGES]) == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "2+2?"}]},
    ]
    assert json.loads(attrs[semconv.GEN_AI_OUTPUT_MESSAGES]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "4"}], "finish_reason": "stop"}
    ]
    assert attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] == 3 and attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 1
    assert attrs[semconv.GEN_AI_RESPONSE_ID] == "r-1"
    assert list(attrs[semconv.LLM_PROMPT_TOKEN_IDS]) == [1, 2, 3]
    assert list(attrs[semconv.LLM_COMPLETION_TOKEN_IDS]) == [7]
    assert list(attrs[semconv.LLM_LOGPROBS]) == [-0.5]


def test_emit_response_closes_latest_open_prompt_and_keeps_tool_calls(spans):
    spanrl.emit_prompt("first", model="a")
    spanrl.emit_prompt("second", model="b")
    spanrl.emit_response({"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]})
    assert [s.name for s in spans.all()] == ["chat b"]
    out = json.loads(spans.one("chat b").attributes[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert out[0]["parts"] == [{"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 1}}]
    spanrl.emit_response("done")
    assert spans.one("chat a").attributes[semconv.GEN_AI_OUTPUT_MESSAGES]


def test_emit_response_without_prompt_is_marked(spans):
    spanrl.emit_response("lonely", input_tokens=-1, completion_token_ids=[1, "x"])
    span = spans.one("chat")
    error = span.attributes[semconv.EMIT_ERROR]
    assert "no open emit_prompt" in error
    assert "gen_ai.usage.input_tokens must be a non-negative integer, got -1" in error
    assert "spanrl.llm.completion_token_ids must hold only integers" in error
    assert semconv.LLM_COMPLETION_TOKEN_IDS not in span.attributes


def test_emit_prompt_unserializable_messages_never_raise(spans):
    call = spanrl.emit_prompt(12345)  # type: ignore[arg-type]
    spanrl.emit_response(object(), call=call)  # type: ignore[arg-type]
    span = spans.one("chat")
    assert "cannot be recorded" in span.attributes[semconv.EMIT_ERROR]


def test_agent_context_manager_parents_llm_and_reward_spans(spans):
    with spanrl.agent("planner", agent_id="p1") as span:
        assert span.is_recording()
        spanrl.emit_reward(1.0)
    planner = spans.one("invoke_agent planner")
    assert planner.attributes[semconv.GEN_AI_OPERATION_NAME] == semconv.OP_INVOKE_AGENT
    assert planner.attributes[semconv.GEN_AI_AGENT_NAME] == "planner"
    assert planner.attributes[semconv.GEN_AI_AGENT_ID] == "p1"
    assert spans.one(semconv.REWARD_SPAN_NAME).parent.span_id == planner.context.span_id


def test_agent_decorator_sync_and_async_reraise_unchanged(spans):
    @spanrl.agent("solver")
    def solve(x: int) -> int:
        if x < 0:
            raise ValueError("negative")
        return x * 2

    @spanrl.agent("writer")
    async def write() -> str:
        await asyncio.sleep(0)
        with spanrl.agent("critic"):
            return "text"

    assert solve(2) == 4
    with pytest.raises(ValueError, match="negative") as info:
        solve(-1)
    assert type(info.value) is ValueError
    assert asyncio.run(write()) == "text"
    solver_spans = spans.named("invoke_agent solver")
    assert len(solver_spans) == 2
    assert [s.status.status_code for s in solver_spans] == [StatusCode.UNSET, StatusCode.ERROR]
    assert solver_spans[1].events[0].name == "exception"
    critic, writer = spans.one("invoke_agent critic"), spans.one("invoke_agent writer")
    assert critic.parent.span_id == writer.context.span_id


def test_llm_call_context_manager_never_leaves_a_span_open(spans):
    with spanrl.emit_prompt("a", model="ok") as call:
        spanrl.emit_response("fine", call=call)
    with spanrl.emit_prompt("b", model="forgot"):
        pass
    with pytest.raises(TimeoutError):
        with spanrl.emit_prompt("c", model="failed"):
            raise TimeoutError("llm down")
    assert semconv.EMIT_ERROR not in spans.one("chat ok").attributes
    assert "closed without emit_response" in spans.one("chat forgot").attributes[semconv.EMIT_ERROR]
    failed = spans.one("chat failed")
    assert failed.status.status_code == StatusCode.ERROR and failed.events[0].name == "exception"
    spanrl.emit_response("late")  # nothing is pending any more: its own span, marked
    assert "no open emit_prompt" in spans.one("chat").attributes[semconv.EMIT_ERROR]
