"""Rollout context: env ids as resource attributes, `spanrl.rollout` root span and baggage."""

from __future__ import annotations

import asyncio
import threading

import pytest
from opentelemetry import baggage, trace

import spanrl
from spanrl import semconv
from spanrl.instrumentation import current_rollout, rollout_resource_attributes
from spanrl.instrumentation._processor import RolloutSpanProcessor


def test_rollout_opens_root_span_and_children_carry_ids(spans):
    with trace.get_tracer("t").start_as_current_span("server request"):
        with spanrl.rollout("r-17", task_id="t-3", attempt=2, mode="val") as root:
            assert baggage.get_baggage(semconv.ROLLOUT_ID) == "r-17"
            with trace.get_tracer("t").start_as_current_span("llm"):
                spanrl.emit_reward(0.5)
        assert baggage.get_baggage(semconv.ROLLOUT_ID) is None
    rollout_span = spans.one(semconv.ROLLOUT_SPAN_NAME)
    assert rollout_span.parent is None  # a new trace, not under the server request
    assert rollout_span.context.span_id == root.get_span_context().span_id
    for span in (rollout_span, spans.one("llm"), spans.one(semconv.REWARD_SPAN_NAME)):
        assert span.attributes[semconv.ROLLOUT_ID] == "r-17"
        assert span.attributes[semconv.TASK_ID] == "t-3"
        assert span.attributes[semconv.ATTEMPT] == 2
        assert span.attributes[semconv.MODE] == "val"
    assert spans.one("llm").context.trace_id == rollout_span.context.trace_id
    assert "spanrl.rollout.id" not in spans.one("server request").attributes


def test_rollout_not_root_nests_under_current_span(spans):
    with trace.get_tracer("t").start_as_current_span("outer") as outer:
        with spanrl.rollout("r-1", root=False):
            pass
    assert spans.one(semconv.ROLLOUT_SPAN_NAME).parent.span_id == outer.get_span_context().span_id


def test_rollout_decorator_each_call_is_its_own_rollout(spans):
    @spanrl.rollout("r-dec", task_id="t")
    def run(x: int) -> int:
        spanrl.emit_reward(x)
        return x

    @spanrl.rollout("r-async")
    async def arun() -> str:
        await asyncio.sleep(0)
        spanrl.emit_reward(1)
        return "ok"

    assert run(1) + run(2) == 3
    assert asyncio.run(arun()) == "ok"
    roots = spans.named(semconv.ROLLOUT_SPAN_NAME)
    assert len(roots) == 3 and len({r.context.trace_id for r in roots}) == 3
    rewards = spans.named(semconv.REWARD_SPAN_NAME)
    assert sorted(r.attributes[semconv.ROLLOUT_ID] for r in rewards) == ["r-async", "r-dec", "r-dec"]


def test_rollout_exception_passes_through_and_is_recorded(spans):
    with pytest.raises(KeyError):
        with spanrl.rollout("r-err"):
            raise KeyError("missing")
    span = spans.one(semconv.ROLLOUT_SPAN_NAME)
    assert span.status.status_code.name == "ERROR"
    assert baggage.get_baggage(semconv.ROLLOUT_ID) is None


def test_rollouts_in_threads_do_not_mix(spans):
    def worker(i: int) -> None:
        with spanrl.rollout(f"r-{i}"):
            for _ in range(20):
                spanrl.emit_reward(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rewards = spans.named(semconv.REWARD_SPAN_NAME)
    assert len(rewards) == 80
    assert all(r.attributes[semconv.ROLLOUT_ID] == f"r-{int(r.attributes[semconv.REWARD_VALUE])}" for r in rewards)


def test_rollout_bad_ids_warn_but_run(spans, caplog):
    with spanrl.rollout("", attempt="two"):  # type: ignore[arg-type]
        spanrl.emit_reward(1.0)
    assert "rollout_id must be a non-empty string" in caplog.text
    assert "attempt must be an int" in caplog.text
    assert semconv.ROLLOUT_ID not in spans.one(semconv.REWARD_SPAN_NAME).attributes


def test_env_ids_become_resource_attributes(monkeypatch):
    monkeypatch.setenv("SPANRL_ROLLOUT_ID", "r-env")
    monkeypatch.setenv("SPANRL_TASK_ID", "t-env")
    monkeypatch.setenv("SPANRL_ATTEMPT", "3")
    monkeypatch.delenv("SPANRL_MODE", raising=False)
    assert rollout_resource_attributes() == {
        semconv.ROLLOUT_ID: "r-env",
        semconv.TASK_ID: "t-env",
        semconv.ATTEMPT: 3,
        semconv.MODE: "train",
    }
    assert current_rollout()[semconv.ROLLOUT_ID] == "r-env"
    with spanrl.rollout("r-inner"):
        assert current_rollout()[semconv.ROLLOUT_ID] == "r-inner"


def test_env_bad_attempt_is_ignored_with_warning(monkeypatch, caplog):
    monkeypatch.setenv("SPANRL_ROLLOUT_ID", "r")
    monkeypatch.setenv("SPANRL_ATTEMPT", "first")
    attrs = rollout_resource_attributes()
    assert semconv.ATTEMPT not in attrs and attrs[semconv.ROLLOUT_ID] == "r"
    assert "SPANRL_ATTEMPT='first' is not an integer" in caplog.text


def test_processor_fallback_stamps_env_ids_where_baggage_has_none(spans):
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(RolloutSpanProcessor({semconv.ROLLOUT_ID: "r-env", semconv.ATTEMPT: 1}))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("plain") as plain:
        pass
    with spanrl.rollout("r-bag"):
        with tracer.start_as_current_span("inside") as inside:
            pass
    assert plain.attributes[semconv.ROLLOUT_ID] == "r-env"
    assert inside.attributes[semconv.ROLLOUT_ID] == "r-bag"
    assert inside.attributes[semconv.ATTEMPT] == 1  # baggage had no attempt: the env's


def test_processor_reads_the_baggage_of_the_context_a_span_starts_in(spans):
    """The parent context the SDK hands on_start decides, even an empty one, not the current context."""
    from opentelemetry import context
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    provider.add_span_processor(RolloutSpanProcessor())
    tracer = provider.get_tracer("t")
    with spanrl.rollout("r-current"):
        elsewhere = tracer.start_span("elsewhere", context=context.Context())  # an empty context: no baggage
        elsewhere.end()
        here = tracer.start_span("here")
        here.end()
    given = tracer.start_span("given", context=baggage.set_baggage(semconv.ROLLOUT_ID, "r-given"))
    given.end()
    assert semconv.ROLLOUT_ID not in elsewhere.attributes
    assert here.attributes[semconv.ROLLOUT_ID] == "r-current"
    assert given.attributes[semconv.ROLLOUT_ID] == "r-given"
