"""The reward span written straight into the export queue (``_direct.py``) is the span the SDK path makes:
same trace, parent, trace state, name, kind, attributes (rollout ids included), resource and scope; only
its span id and time differ. Anything else on the provider (here the tests' in-memory exporter) takes the
SDK path, so every other test of the emit API still sees SDK spans."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import baggage, context, trace

import spanrl
from spanrl import semconv
from spanrl.instrumentation._processor import RolloutSpanProcessor
from spanrl.instrumentation.batch import BatchEncodingSpanProcessor
from spanrl.instrumentation.exporter import FastOTLPSpanExporter, encode_snapshot

_SPAN_ID, _END_TIMES = 3, (9, 10)  # snapshot fields that differ between two spans


@pytest.fixture
def queue(spans: Any) -> Iterator[tuple[BatchEncodingSpanProcessor, tuple[Any, ...], tuple[Any, ...]]]:
    """(the batch processor, the processors of the direct route, those of the SDK route) on the provider."""
    provider = trace.get_tracer_provider()
    active = provider._active_span_processor  # type: ignore[attr-defined]
    saved = active._span_processors
    batch = BatchEncodingSpanProcessor(FastOTLPSpanExporter(endpoint="127.0.0.1:9", insecure=True),
                                       schedule_delay_millis=3_600_000)
    rollout = RolloutSpanProcessor({semconv.TASK_ID: "t-env"})
    testing = tuple(p for p in saved if not isinstance(p, RolloutSpanProcessor))  # the in-memory exporter
    try:
        yield batch, (rollout, batch), (rollout, batch, *testing)
    finally:
        active._span_processors = saved
        batch._shutdown = True


def _emit(processors: tuple[Any, ...], fn: Any) -> tuple[Any, ...]:
    provider = trace.get_tracer_provider()
    provider._active_span_processor._span_processors = processors  # type: ignore[attr-defined]
    batch = next(p for p in processors if isinstance(p, BatchEncodingSpanProcessor))
    batch._queue.clear()
    fn()
    (snap,) = [s for s in batch._queue if s[7] == semconv.REWARD_SPAN_NAME]
    return snap


def _same_but_id_and_time(direct: tuple[Any, ...], sdk: tuple[Any, ...]) -> None:
    assert len(direct) == len(sdk)
    differ = [i for i, (a, b) in enumerate(zip(direct, sdk)) if a != b]
    assert set(differ) <= {_SPAN_ID, *_END_TIMES}, [(i, direct[i], sdk[i]) for i in differ]
    assert direct[_SPAN_ID] != sdk[_SPAN_ID]
    assert direct[_END_TIMES[0]] == direct[_END_TIMES[1]] > 0
    resource, scope, span = encode_snapshot(direct)
    assert semconv.REWARD_SPAN_NAME.encode() in span and resource == encode_snapshot(sdk)[0] and scope


def test_direct_reward_inside_a_rollout_equals_the_sdk_span(queue: Any) -> None:
    batch, direct, sdk = queue

    def reward() -> None:
        spanrl.emit_reward(0.5, name="judge", explanation="close")

    with spanrl.rollout(rollout_id="r-9", task_id="t-3", attempt=2):
        with trace.get_tracer("agent").start_as_current_span("step") as step:
            fast, slow = _emit(direct, reward), _emit(sdk, reward)
    assert fast[2] == step.get_span_context().trace_id and fast[5] == step.get_span_context().span_id
    _same_but_id_and_time(fast, slow)
    attributes = dict(zip(fast[18:18 + (len(fast) - 18) // 2], fast[18 + (len(fast) - 18) // 2:]))
    assert attributes[semconv.REWARD_VALUE] == 0.5 and attributes[semconv.ROLLOUT_ID] == "r-9"
    assert attributes[semconv.ATTEMPT] == 2 and attributes[semconv.GEN_AI_EVALUATION_EXPLANATION] == "close"


def test_direct_root_reward_and_remote_parent_with_trace_state(queue: Any) -> None:
    batch, direct, sdk = queue
    fast, slow = _emit(direct, lambda: spanrl.emit_reward(1.0)), _emit(sdk, lambda: spanrl.emit_reward(1.0))
    assert fast[5] is None and slow[5] is None  # roots, each its own trace
    assert fast[2] != slow[2]
    assert fast[18:] == slow[18:]  # the environment's task id stamped as the processor would

    parent = trace.SpanContext(0x1234, 0x99, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
                               trace_state=trace.TraceState([("vendor", "x")]))
    ctx = baggage.set_baggage(semconv.ROLLOUT_ID, "r-remote", trace.set_span_in_context(trace.NonRecordingSpan(parent)))

    def under_remote_parent() -> None:
        token = context.attach(ctx)
        try:
            spanrl.emit_reward(0.25)
        finally:
            context.detach(token)

    fast, slow = _emit(direct, under_remote_parent), _emit(sdk, under_remote_parent)
    _same_but_id_and_time(fast, slow)
    assert fast[2] == 0x1234 and fast[4] == "vendor=x" and fast[5] == 0x99 and fast[6] is True


def test_unsampled_parent_exports_nothing_either_way(queue: Any) -> None:
    batch, direct, sdk = queue
    parent = trace.SpanContext(0x55, 0x66, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT))
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    for processors in (direct, sdk):
        trace.get_tracer_provider()._active_span_processor._span_processors = processors  # type: ignore[attr-defined]
        batch._queue.clear()
        token = context.attach(ctx)
        try:
            spanrl.emit_reward(1.0)
        finally:
            context.detach(token)
        assert list(batch._queue) == []


def test_an_extra_processor_takes_the_sdk_path(queue: Any, spans: Any) -> None:
    batch, direct, sdk = queue
    _emit(sdk, lambda: spanrl.emit_reward(0.75))
    assert spans.one(semconv.REWARD_SPAN_NAME).attributes[semconv.REWARD_VALUE] == 0.75  # the SDK span, seen

