"""The reward span written straight into the export queue (``_direct.py``) is the span the SDK path makes:
same trace, parent, trace state, name, kind, attributes (rollout ids included), resource and scope; only
its span id and time differ. Anything else on the provider (here the tests' in-memory exporter) takes the
SDK path, so every other test of the emit API still sees SDK spans. The queued spans are compared as the
collector gets them: encoded (with the C encoder and with the Python one), then decoded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import baggage, context, trace

import spanrl
from spanrl import semconv
from spanrl.instrumentation._processor import RolloutSpanProcessor
from spanrl.instrumentation.batch import BatchEncodingSpanProcessor
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span

from spanrl.instrumentation.exporter import FastOTLPSpanExporter, encode_snapshot

Queued = tuple[bytes, bytes, Span]  # a queued span: its resource and scope parts, and the span decoded


@pytest.fixture(autouse=True)
def _each_encoder(encoder: str) -> None:
    """Every test here with the C encoder and with the Python one (tests/instrumentation/conftest.py)."""


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


def _emit(processors: tuple[Any, ...], fn: Any) -> Queued:
    provider = trace.get_tracer_provider()
    provider._active_span_processor._span_processors = processors  # type: ignore[attr-defined]
    batch = next(p for p in processors if isinstance(p, BatchEncodingSpanProcessor))
    batch._queue.clear()
    fn()
    queued = [encode_snapshot(snap) for snap in batch._queue]
    (reward,) = [(resource, scope, ScopeSpans.FromString(field).spans[0]) for resource, scope, field in queued
                 if ScopeSpans.FromString(field).spans[0].name == semconv.REWARD_SPAN_NAME]
    return reward


def _general_path_not_called(*args: Any) -> None:
    raise AssertionError("emit_reward's general path ran: the shortcut did not take this reward")


def _shortcut(fn: Any) -> Any:
    """``fn`` with emit_reward's general path switched off: a reward it writes came by the shortcut."""
    from spanrl.instrumentation import _emit as emit_api

    def run() -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(emit_api, "_emit_one_reward", _general_path_not_called)
            fn()
    return run


def _attributes(span: Span) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in span.attributes}


def _same_but_id_and_time(direct: Queued, sdk: Queued) -> None:
    assert direct[:2] == sdk[:2]  # resource and scope
    fast, slow = Span(), Span()
    fast.CopyFrom(direct[2])
    slow.CopyFrom(sdk[2])
    assert fast.span_id != slow.span_id
    assert fast.start_time_unix_nano == fast.end_time_unix_nano > 0
    for span in (fast, slow):
        for name in ("span_id", "start_time_unix_nano", "end_time_unix_nano"):
            span.ClearField(name)
    assert fast == slow
    assert list(_attributes(fast)) == list(_attributes(slow))  # in the same order too


@pytest.mark.parametrize("kwargs", [{}, {"name": "judge", "explanation": "close"}], ids=["float", "named"])
def test_direct_reward_inside_a_rollout_equals_the_sdk_span(queue: Any, kwargs: dict[str, str]) -> None:
    """A bare float takes emit_reward's shortcut (no attribute dict); a named reward the general path."""
    batch, direct, sdk = queue

    def reward() -> None:
        spanrl.emit_reward(0.5, **kwargs)

    with spanrl.rollout(rollout_id="r-9", task_id="t-3", attempt=2):
        with trace.get_tracer("agent").start_as_current_span("step") as step:
            fast, slow = _emit(direct, reward if kwargs else _shortcut(reward)), _emit(sdk, reward)
    span = fast[2]
    assert span.trace_id == step.get_span_context().trace_id.to_bytes(16, "big")
    assert span.parent_span_id == step.get_span_context().span_id.to_bytes(8, "big")
    _same_but_id_and_time(fast, slow)
    attributes = _attributes(span)
    assert attributes[semconv.REWARD_VALUE] == 0.5 and attributes[semconv.ROLLOUT_ID] == "r-9"
    assert attributes[semconv.REWARD_NAME] == kwargs.get("name", "reward") and attributes[semconv.ATTEMPT] == 2
    assert attributes.get(semconv.GEN_AI_EVALUATION_EXPLANATION) == kwargs.get("explanation")


def test_direct_root_reward_and_remote_parent_with_trace_state(queue: Any) -> None:
    batch, direct, sdk = queue
    fast, slow = _emit(direct, _shortcut(lambda: spanrl.emit_reward(1.0))), _emit(sdk, lambda: spanrl.emit_reward(1.0))
    assert fast[2].parent_span_id == slow[2].parent_span_id == b""  # roots, each its own trace
    assert fast[2].trace_id != slow[2].trace_id
    assert _attributes(fast[2]) == _attributes(slow[2])  # the environment's task id stamped as the processor would
    assert _attributes(fast[2])[semconv.TASK_ID] == "t-env"

    parent = trace.SpanContext(0x1234, 0x99, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
                               trace_state=trace.TraceState([("vendor", "x")]))
    ctx = baggage.set_baggage(semconv.ROLLOUT_ID, "r-remote", trace.set_span_in_context(trace.NonRecordingSpan(parent)))

    def under_remote_parent() -> None:
        token = context.attach(ctx)
        try:
            spanrl.emit_reward(0.25)
        finally:
            context.detach(token)

    fast, slow = _emit(direct, _shortcut(under_remote_parent)), _emit(sdk, under_remote_parent)
    _same_but_id_and_time(fast, slow)
    span = fast[2]
    assert span.trace_id == (0x1234).to_bytes(16, "big") and span.trace_state == "vendor=x"
    assert span.parent_span_id == (0x99).to_bytes(8, "big") and span.flags == 0x300  # a remote parent


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



def test_a_failing_direct_route_falls_back_to_sdk_spans_for_good(queue: Any, monkeypatch: Any, caplog: Any) -> None:
    """An SDK whose internals differ makes the direct route raise: the reward is still recorded (an SDK
    span), the failure is logged once, and later rewards go straight to SDK spans."""
    from spanrl.instrumentation import _direct
    from spanrl.instrumentation import _emit as emit_api

    batch, direct, sdk = queue
    monkeypatch.setattr(emit_api, "_emit_instant", _direct.emit_instant)  # restored after the test

    def broken_clock() -> int:
        raise AttributeError("no such SDK field")

    monkeypatch.setattr(_direct, "time_ns", broken_clock)
    first = _emit(direct, lambda: spanrl.emit_reward(1.0))
    second = _emit(direct, lambda: spanrl.emit_reward(0.5))
    assert _attributes(first[2])[semconv.REWARD_VALUE] == 1.0 and _attributes(second[2])[semconv.REWARD_VALUE] == 0.5
    assert caplog.text.count("the direct reward span failed") == 1
    assert emit_api._emit_instant is emit_api._no_direct_route


def test_a_value_the_sdk_would_truncate_takes_the_sdk_path(queue: Any, monkeypatch: Any) -> None:
    """A rollout id (from baggage) longer than the attribute length limit: the SDK span, which truncates it."""
    from spanrl.instrumentation import _direct

    batch, direct, sdk = queue
    _emit(direct, lambda: spanrl.emit_reward(1.0))  # builds the route
    monkeypatch.setattr(_direct._route, "max_length", 8)
    direct_writes = []
    monkeypatch.setattr(_direct, "time_ns", lambda: direct_writes.append(1) or 1)
    with spanrl.rollout(rollout_id="r-short"):
        _emit(direct, lambda: spanrl.emit_reward(1.0))
    assert len(direct_writes) == 1
    with spanrl.rollout(rollout_id="r-longer-than-8"):
        reward = _emit(direct, lambda: spanrl.emit_reward(1.0))
    assert len(direct_writes) == 1 and _attributes(reward[2])[semconv.ROLLOUT_ID] == "r-longer-than-8"
