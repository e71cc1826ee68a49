"""`spanrl.store.online` on real spans: an in-process collector, the SDK's OTLP/gRPC exporter, plain
OTel spans in the documented shape (what another language would send), queries through the store."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from spanrl import semconv as sc
from spanrl.store.online import Watermark, count_aged_out, now_ns, ready_rollouts

_WINDOW: dict[str, Any] = {"horizon_ns": 0, "quiet_s": 60.0}


def _provider(collector: Any, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    return provider


def _rollout(tracer: Any, rollout_id: str, task_id: str, response_id: str, version: int) -> str:
    """A finished rollout: root span + one policy-server call with token ids; returns its trace id."""
    ids = {sc.ROLLOUT_ID: rollout_id, sc.TASK_ID: task_id}
    with tracer.start_as_current_span(sc.ROLLOUT_SPAN_NAME, attributes=ids) as root:
        with tracer.start_as_current_span("chat policy", kind=SpanKind.SERVER, attributes={
            **ids, sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_RESPONSE_ID: response_id, sc.POLICY_VERSION: version,
            sc.LLM_PROMPT_TOKEN_IDS: [1, 2, 3], sc.LLM_COMPLETION_TOKEN_IDS: [4, 2], sc.LLM_LOGPROBS: [-0.5, -0.1],
        }):
            pass
        return f"{root.get_span_context().trace_id:032x}"


def _feedback(tracer: Any, value: float, **key: str) -> None:
    """The documented `spanrl.feedback` span, written by hand as another language would."""
    attributes = {sc.REWARD_VALUE: value, sc.REWARD_NAME: "reward", sc.GEN_AI_EVALUATION_SCORE_VALUE: value}
    attributes.update({{"rollout_id": sc.ROLLOUT_ID, "response_id": sc.GEN_AI_RESPONSE_ID,
                        "trace_id": sc.FEEDBACK_TRACE_ID}[k]: v for k, v in key.items()})
    tracer.start_span(sc.FEEDBACK_SPAN_NAME, attributes=attributes).end()


def test_feedback_resolves_by_each_key_latest_wins_and_unjudged_rollouts_age_out(collector):
    agents, users = _provider(collector, "agent"), _provider(collector, "feedback-service")
    agent, user = agents.get_tracer("agent"), users.get_tracer("users")
    _rollout(agent, "r1", "sky", "chatcmpl-1", version=3)
    trace_2 = _rollout(agent, "r2", "sky", "chatcmpl-2", version=4)
    _rollout(agent, "r3", "snow", "chatcmpl-3", version=4)
    _rollout(agent, "r4", "snow", "chatcmpl-4", version=4)  # never judged
    _feedback(user, 0.0, response_id="chatcmpl-1")
    time.sleep(0.01)
    _feedback(user, 1.0, response_id="chatcmpl-1")  # the user changed their mind: this one counts
    _feedback(user, 0.25, trace_id=trace_2)
    _feedback(user, 0.75, rollout_id="r3")
    _feedback(user, 1.0, response_id="chatcmpl-unknown")  # resolves to no rollout: ignored

    now = now_ns(collector.store)
    ready = ready_rollouts(collector.store, Watermark(), now=now, settle_s=0.0, max_age_s=30.0, **_WINDOW)
    by_id = {r.rollout_id: r for r in ready}
    assert set(by_id) == {"r1", "r2", "r3"}
    assert (by_id["r1"].reward, by_id["r1"].feedback_count, by_id["r1"].min_policy_version) == (1.0, 2, 3)
    assert (by_id["r2"].reward, by_id["r2"].task_id) == (0.25, "sky")
    assert by_id["r3"].reward == 0.75 and by_id["r3"].token_calls == 1
    assert [r.ready_ns for r in ready] == sorted(r.ready_ns for r in ready)

    # The watermark: nothing at or below it comes back; settle_s holds back what just became ready.
    last = ready[-1]
    assert ready_rollouts(collector.store, Watermark(last.ready_ns, last.rollout_id), now=now, settle_s=0.0,
                          max_age_s=30.0, **_WINDOW) == []
    assert ready_rollouts(collector.store, Watermark(), now=now, settle_s=60.0, max_age_s=30.0, **_WINDOW) == []
    assert ready_rollouts(collector.store, Watermark(), now=now, settle_s=0.0, max_age_s=30.0, reward_name="other",
                          **_WINDOW) == []

    # Aging: once max_age_s has passed since completion, only the never-judged rollout counts, once.
    later = now + 1_500_000_000  # the store's clock 1.5 s on, given (no sleep)
    assert count_aged_out(collector.store, since_ns=0, now=later, max_age_s=1.0, **_WINDOW) == (1, 0)
    assert count_aged_out(collector.store, since_ns=later, now=later + 1, max_age_s=1.0, **_WINDOW) == (0, 0)
    assert count_aged_out(collector.store, since_ns=0, now=later, max_age_s=30.0, **_WINDOW) == (0, 0)
    agents.shutdown()
    users.shutdown()


def test_an_end_stored_by_the_trainer_completes_a_rollout_and_a_timeout_fails_it(collector):
    """Agents without spanrl open no spanrl.rollout span: the spanrl.rollout.end span (store/views.sql's
    rollout_state) completes them at once instead of after quiet_s, and a timeout is a failure. A
    response id two rollouts claim resolves to neither."""
    from spanrl.store.rollouts import record_end

    agents, users = _provider(collector, "agent"), _provider(collector, "feedback-service")
    agent, user = agents.get_tracer("agent"), users.get_tracer("users")
    for rid, response in (("exited", "chatcmpl-e"), ("timed-out", "chatcmpl-t"), ("twice-a", "chatcmpl-2"),
                          ("twice-b", "chatcmpl-2")):
        with agent.start_as_current_span("chat policy", kind=SpanKind.SERVER, attributes={
            sc.ROLLOUT_ID: rid, sc.TASK_ID: "t", sc.GEN_AI_RESPONSE_ID: response, sc.POLICY_VERSION: 1,
            sc.LLM_PROMPT_TOKEN_IDS: [1, 2], sc.LLM_COMPLETION_TOKEN_IDS: [3], sc.LLM_LOGPROBS: [-0.1],
        }):
            pass
    for response in ("chatcmpl-e", "chatcmpl-t", "chatcmpl-2"):
        _feedback(user, 1.0, response_id=response)
    record_end(collector.store, "exited", "agent_exit")
    record_end(collector.store, "timed-out", "timeout", error="ran past 60 s")
    record_end(collector.store, "twice-a", "agent_exit")
    record_end(collector.store, "twice-b", "agent_exit")

    now = now_ns(collector.store)
    ready = ready_rollouts(collector.store, Watermark(), now=now, settle_s=0.0, max_age_s=30.0, **_WINDOW)
    assert [r.rollout_id for r in ready] == ["exited"]  # quiet_s is 60: only the stored end completes it
    later = now + 1_500_000_000  # the store's clock 1.5 s on, given (no sleep)
    # aged out: the two rollouts whose feedback named a response id both claim; failed: the timeout
    assert count_aged_out(collector.store, since_ns=0, now=later, max_age_s=1.0, **_WINDOW) == (2, 1)
    agents.shutdown()
    users.shutdown()


def test_a_forged_client_span_with_the_victims_response_id_does_not_capture_its_feedback(collector):
    """Issue 28, finding 7: a response-id key resolves only through the policy server's (SERVER) span; a
    client span of another rollout reusing the id used to make the key ambiguous and the feedback was lost."""
    agents, users, other = (_provider(collector, s) for s in ("agent", "feedback-service", "attacker"))
    _rollout(agents.get_tracer("agent"), "victim", "sky", "chatcmpl-v", version=1)
    attacker = other.get_tracer("attacker")
    with attacker.start_as_current_span(sc.ROLLOUT_SPAN_NAME,
                                        attributes={sc.ROLLOUT_ID: "attacker-r", sc.TASK_ID: "sky"}):
        with attacker.start_as_current_span("chat", kind=SpanKind.CLIENT, attributes={
                sc.ROLLOUT_ID: "attacker-r", sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_RESPONSE_ID: "chatcmpl-v"}):
            pass
    _feedback(users.get_tracer("users"), 0.5, response_id="chatcmpl-v")
    ready = ready_rollouts(collector.store, Watermark(), now=now_ns(collector.store), settle_s=0.0, max_age_s=30.0,
                           **_WINDOW)
    assert {r.rollout_id: r.reward for r in ready} == {"victim": 0.5}
