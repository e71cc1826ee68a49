"""`spanrl.emit_feedback` on a real SDK provider: one key per span, the reward as a `gen_ai.evaluation.result`
event, a root span of its own, bad input warned about and never raised."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.trace import SpanKind, StatusCode

import spanrl
from spanrl import semconv

_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("key", "value", "attribute", "stored"),
    [
        ("rollout_id", "r-17", semconv.ROLLOUT_ID, "r-17"),
        ("response_id", "chatcmpl-abc", semconv.GEN_AI_RESPONSE_ID, "chatcmpl-abc"),
        ("trace_id", _TRACE.upper(), semconv.FEEDBACK_TRACE_ID, _TRACE),
        ("trace_id", int(_TRACE, 16), semconv.FEEDBACK_TRACE_ID, _TRACE),
    ],
)
def test_emit_feedback_writes_one_key_and_the_reward(spans, key, value, attribute, stored):
    spanrl.emit_feedback(0.5, name="thumbs", explanation="user clicked up", **{key: value})
    span = spans.one(semconv.FEEDBACK_SPAN_NAME)
    attrs = dict(span.attributes)
    assert attrs[attribute] == stored
    other_keys = {semconv.ROLLOUT_ID, semconv.GEN_AI_RESPONSE_ID, semconv.FEEDBACK_TRACE_ID} - {attribute}
    assert not other_keys & set(attrs)
    assert semconv.REWARD_VALUE not in attrs and semconv.GEN_AI_EVALUATION_SCORE_VALUE not in attrs  # one reward
    # The reward is the GenAI conventions' evaluation event; a response key rides on it too.
    (event,) = span.events
    expected = {semconv.GEN_AI_EVALUATION_NAME: "thumbs", semconv.GEN_AI_EVALUATION_SCORE_VALUE: 0.5,
                semconv.GEN_AI_EVALUATION_EXPLANATION: "user clicked up"}
    if key == "response_id":
        expected[semconv.GEN_AI_RESPONSE_ID] = stored
    assert event.name == semconv.GEN_AI_EVALUATION_RESULT_EVENT and dict(event.attributes) == expected
    assert span.kind == SpanKind.INTERNAL and span.status.status_code == StatusCode.UNSET


def test_emit_feedback_inside_another_rollout_is_a_root_span_without_its_ids(spans):
    with spanrl.rollout(rollout_id="r-current", task_id="t-1"):
        spanrl.emit_feedback(1.0, response_id="chatcmpl-of-another-rollout")
    span = spans.one(semconv.FEEDBACK_SPAN_NAME)
    root = spans.one(semconv.ROLLOUT_SPAN_NAME)
    assert span.parent is None
    assert span.context.trace_id != root.context.trace_id
    assert semconv.ROLLOUT_ID not in span.attributes and semconv.TASK_ID not in span.attributes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"value": 1.0}, "emit_feedback needs exactly one of rollout_id, response_id, trace_id; got none"),
        ({"value": 1.0, "rollout_id": "r", "response_id": "c"},
         "emit_feedback needs exactly one of rollout_id, response_id, trace_id; got rollout_id, response_id"),
        ({"value": 1.0, "trace_id": "xyz"},
         "emit_feedback: trace_id must be 32 hex characters (or a non-zero 128-bit int), got 'xyz'"),
        ({"value": 1.0, "trace_id": "0" * 32}, "emit_feedback: trace_id must be 32 hex characters"),
        ({"value": 1.0, "rollout_id": ""}, "emit_feedback: rollout_id must be a non-empty string, got ''"),
        ({"value": float("nan"), "rollout_id": "r"}, "emit_feedback: value must be a finite number, got nan (float)"),
        ({"value": "good", "rollout_id": "r"}, "emit_feedback: value must be a finite number, got 'good' (str)"),
        ({"value": True, "rollout_id": "r"}, "emit_feedback: value must be a finite number, got True (bool)"),
    ],
)
def test_emit_feedback_bad_input_warns_and_trains_nothing(spans, caplog, kwargs, message):
    value = kwargs.pop("value")
    with caplog.at_level(logging.WARNING, logger="spanrl.instrumentation"):
        spanrl.emit_feedback(value, **kwargs)  # never raises
    span = spans.one(semconv.FEEDBACK_SPAN_NAME)
    assert message in span.attributes[semconv.EMIT_ERROR]
    assert span.status.status_code == StatusCode.ERROR
    assert semconv.REWARD_VALUE not in span.attributes and semconv.GEN_AI_EVALUATION_SCORE_VALUE not in span.attributes
    assert not span.events
    assert message in caplog.text


def test_emit_feedback_without_an_sdk_says_so_once(tmp_path):
    """A feedback script that forgot ``configure()``: one warning naming the fix, not silence."""
    import os
    import subprocess
    import sys

    script = "import spanrl\nfor _ in range(3):\n    spanrl.emit_feedback(1.0, rollout_id='r-1')\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPANRL_"))}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("no OpenTelemetry SDK in this process") == 1, done.stderr
    assert "spanrl.instrumentation.configure()" in done.stderr
