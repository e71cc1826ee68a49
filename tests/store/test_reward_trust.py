"""Readers never see an unusable reward, and "latest wins" goes by the collector's clock (issue 28 items 2, 3, 8).

The collector now rejects such rewards at ingest (tests/collector/test_reward_check.py); these rows are
written straight into the store, as a store filled before that check holds them. The ordering test
sends real spans through the SDK's OTLP/gRPC exporter.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from spanrl import semconv as sc
from spanrl.algorithms import load_transitions
from spanrl.algorithms.credit import CreditConfig
from spanrl.collector.encoding import encode_request
from spanrl.store.online import Watermark, now_ns, ready_rollouts
from _otlp import kv, make_request

_BAD = (1e200, float("nan"), float("inf"), -1e30, 1e7)


def _stored_rollout(store: Any, rollout_id: str, rewards: list[float], *, event_rewards: list[float] = ()) -> None:
    """A finished rollout with one policy-server call (token ids) and these rewards, appended straight into the
    store (no ingest check), as an older store holds them."""
    req, _ = make_request(2 + len(rewards) + len(event_rewards), rollout_id=rollout_id, resource={sc.TASK_ID: "t"})
    spans = req.resource_spans[0].scope_spans[0].spans
    spans[0].name = sc.ROLLOUT_SPAN_NAME
    call = spans[1]
    call.kind = 2  # SERVER
    call.attributes.extend([kv(sc.GEN_AI_OPERATION_NAME, "chat"), kv(sc.LLM_PROMPT_TOKEN_IDS, [1, 2, 3]),
                            kv(sc.LLM_COMPLETION_TOKEN_IDS, [4, 5]), kv(sc.LLM_LOGPROBS, [-0.5, -0.25]),
                            kv(sc.POLICY_VERSION, 0)])
    for span, value in zip(spans[2:], rewards):
        span.name = sc.REWARD_SPAN_NAME
        span.attributes.append(kv(sc.REWARD_VALUE, value))
    for span, value in zip(spans[2 + len(rewards):], event_rewards):
        span.events.add(name=sc.REWARD_SPAN_NAME, time_unix_nano=3_000).attributes.append(kv(sc.REWARD_VALUE, value))
    batch = encode_request(req)
    assert batch.rejected == 0
    store.append(batch.table)


def test_unusable_stored_rewards_reach_no_reader(collector):
    store = collector.store
    for i, value in enumerate(_BAD):
        _stored_rollout(store, f"bad-{i}", [value])
    _stored_rollout(store, "mixed", [1e200, 0.5])
    _stored_rollout(store, "event", [], event_rewards=[1e200])

    values = store.sql("SELECT value FROM rewards").column("value").to_pylist()
    assert values == [0.5]
    finals = {r["rollout_id"]: r["final_reward"]
              for r in store.sql("SELECT rollout_id, final_reward FROM rollouts").to_pylist()}
    assert (finals["mixed"] == 0.5 and all(finals[f"bad-{i}"] is None for i in range(len(_BAD)))
            and finals["event"] is None)

    # load_transitions: an unusable reward counts as a NaN one (credit's nan_reward policy), never as itself.
    batch = load_transitions(store)
    assert batch.transitions == [] and batch.report["nan_reward"] == len(_BAD) + 2  # skipped, with mixed and event
    zeroed = load_transitions(store, credit=CreditConfig(nan_reward="zero", baseline="none", scale_std=False))
    assert sorted((t.rollout_id, t.reward) for t in zeroed.transitions) == sorted(
        [(f"bad-{i}", 0.0) for i in range(len(_BAD))] + [("event", 0.0), ("mixed", 0.5)])

    # The online trainer's query: such rollouts are ready (so they can be quarantined) with no reward.
    ready = ready_rollouts(store, Watermark(), now=now_ns(store), horizon_ns=0, settle_s=0.0, quiet_s=60.0,
                           max_age_s=60.0)
    by_id = {r.rollout_id: r for r in ready}
    assert set(by_id) == {f"bad-{i}" for i in range(len(_BAD))} | {"mixed", "event"}
    assert all(by_id[f"bad-{i}"].reward is None and by_id[f"bad-{i}"].bad_rewards == 1 for i in range(len(_BAD)))
    assert (by_id["mixed"].reward, by_id["mixed"].bad_rewards, by_id["mixed"].reward_count) == (0.5, 1, 2)


def _provider(collector: Any, service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    return provider


def test_latest_verdict_is_the_latest_stored_not_the_latest_stamped(collector):
    """A verdict stamped 2^62 ns (year 2116) first, then honest ones: the last one stored wins."""
    agents, users = _provider(collector, "agent"), _provider(collector, "feedback-service")
    agent, user = agents.get_tracer("agent"), users.get_tracer("users")
    ids = {sc.ROLLOUT_ID: "r1", sc.TASK_ID: "sky"}
    with agent.start_as_current_span(sc.ROLLOUT_SPAN_NAME, attributes=ids):
        with agent.start_as_current_span("chat policy", kind=SpanKind.SERVER, attributes={
            **ids, sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_RESPONSE_ID: "chatcmpl-1", sc.POLICY_VERSION: 0,
            sc.LLM_PROMPT_TOKEN_IDS: [1, 2], sc.LLM_COMPLETION_TOKEN_IDS: [3], sc.LLM_LOGPROBS: [-0.1]}):
            pass
    future = 2**62
    for value, stamp in ((0.0, future), (0.25, None), (1.0, None)):
        span = user.start_span(sc.FEEDBACK_SPAN_NAME, start_time=stamp,
                               attributes={sc.REWARD_VALUE: value, sc.ROLLOUT_ID: "r1"})
        span.end(end_time=stamp)
        time.sleep(0.01)
    ready = ready_rollouts(collector.store, Watermark(), now=now_ns(collector.store), horizon_ns=0, settle_s=0.0,
                           quiet_s=60.0, max_age_s=60.0)
    assert [(r.rollout_id, r.reward, r.feedback_count) for r in ready] == [("r1", 1.0, 3)]
    final = collector.store.sql("SELECT final_reward FROM rollouts WHERE rollout_id = 'r1'").column("final_reward")
    assert final.to_pylist() == [1.0]
    agents.shutdown()
    users.shutdown()


def test_the_readers_bound_is_the_collectors_widest_range(tmp_path):
    from spanrl.collector.rewards import DEFAULT_REWARD_RANGE
    from spanrl.store import SpanStore

    with SpanStore.open(tmp_path / "s.duckdb") as store:
        assert store.sql("SELECT reward_abs_max() AS m").column("m").to_pylist() == [sc.REWARD_ABS_MAX]
    assert DEFAULT_REWARD_RANGE == (-sc.REWARD_ABS_MAX, sc.REWARD_ABS_MAX)
