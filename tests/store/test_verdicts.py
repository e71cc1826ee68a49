"""One rule for verdicts (store/views.sql's rollout_rewards): a reward keyed by response id (on the event or
on its span) or by rollout id resolves to its rollout alike in every reader (and one naming only a
conversation from outside it to none: conversation ids are guessable, issue 53): the rollouts
and rewards views, `spanrl sql`, the viewer's rollouts table, the offline Trainer's load_transitions and the
online trainer's ready_rollouts. Real spans through an in-process collector: a production agent that knows
nothing of spanrl, the policy server's spans, and verdicts sent later by other services."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from spanrl import semconv as sc
from spanrl.algorithms.transitions import load_transitions
from spanrl.store.kept_rollouts import materialize
from spanrl.store.online import Watermark, now_ns, ready_rollouts
from spanrl.store.rollouts import record_end
from spanrl.ui.rollouts import RolloutFilter, RolloutIndex
from spanrl.ui.source import open_source

_EXPECTED = {"conversation:c-1": 0.625, "conversation:c-2": 0.25, "conversation:c-3": 0.75, "r-own": 0.5}


def _tracer(collector: Any, service: str) -> Any:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    return provider.get_tracer(service)


def _conversation_turn(agent: Any, server: Any, response_id: str, root_attrs: dict[str, Any]) -> None:
    """A plain OTel agent's turn: its root span (with gen_ai.conversation.id), its instrumentor's CLIENT span,
    and the policy server's SERVER span under it (the client sent a traceparent)."""
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"question {response_id}"}]}])
    with agent.start_as_current_span("handle request", context=context.Context(), attributes=root_attrs):
        with agent.start_as_current_span("chat model", kind=SpanKind.CLIENT,
                                         attributes={sc.GEN_AI_OPERATION_NAME: "chat"}) as client:
            server.start_span("chat policy", context=trace.set_span_in_context(client), kind=SpanKind.SERVER,
                              attributes={sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_RESPONSE_ID: response_id,
                                          sc.POLICY_VERSION: 0, sc.GEN_AI_INPUT_MESSAGES: messages,
                                          sc.LLM_PROMPT_TOKEN_IDS: [1, 2], sc.LLM_COMPLETION_TOKEN_IDS: [3, 4],
                                          sc.LLM_LOGPROBS: [-0.5, -0.25]}).end()
            client.set_attribute(sc.GEN_AI_RESPONSE_ID, response_id)


def _verdict(judge: Any, value: float, *, event: dict[str, Any] = (), span: dict[str, Any] = (),
             name: str = "evaluate") -> None:
    """An evaluation span of its own (a new trace) carrying a gen_ai.evaluation.result event."""
    attrs = {sc.GEN_AI_EVALUATION_NAME: "judge", sc.GEN_AI_EVALUATION_SCORE_VALUE: value, **dict(event)}
    s = judge.start_span(name, context=context.Context(), attributes=dict(span))
    s.add_event(sc.GEN_AI_EVALUATION_RESULT_EVENT, attrs)
    s.end()


def test_a_verdict_resolves_to_its_rollout_alike_in_every_reader(collector: Any, tmp_path: Any) -> None:
    agent, server = _tracer(collector, "plain-agent"), _tracer(collector, "spanrl-policy")
    judge = _tracer(collector, "judge")
    for n in (1, 2, 3):
        _conversation_turn(agent, server, f"chatcmpl-{n}", {sc.GEN_AI_CONVERSATION_ID: f"c-{n}"})
    _conversation_turn(agent, server, "chatcmpl-own", {sc.ROLLOUT_ID: "r-own"})
    _conversation_turn(agent, server, "chatcmpl-4", {sc.GEN_AI_CONVERSATION_ID: "c-4"})  # never judged
    store = collector.store
    for rollout_id in ("conversation:c-1", "r-own"):  # ended, and kept by the decomposer before their verdicts
        record_end(store, rollout_id, "trainer")
    assert materialize(store)["rollouts_kept"] == 2
    source = open_source(db=None, url=collector.http_endpoint, token=None)
    index = RolloutIndex(source)  # the viewer's table, cached before the verdicts: refreshed incrementally
    assert {r["final_reward"] for r in index.query(RolloutFilter())["rows"]} == {None}

    _verdict(judge, 0.625, event={sc.GEN_AI_RESPONSE_ID: "chatcmpl-1"})  # event-level response id
    _verdict(judge, 0.25, span={sc.GEN_AI_RESPONSE_ID: "chatcmpl-2"})   # span-level response id
    _verdict(judge, 0.0, event={sc.GEN_AI_RESPONSE_ID: "chatcmpl-3"})  # judged twice...
    time.sleep(0.01)
    _verdict(judge, 0.75, span={sc.GEN_AI_RESPONSE_ID: "chatcmpl-3"})   # ...the latest stored wins
    _verdict(judge, 1.0, event={sc.GEN_AI_CONVERSATION_ID: "c-4"})      # a guessable conversation id alone: refused
    _verdict(judge, 0.5, span={sc.ROLLOUT_ID: "r-own"}, name=sc.FEEDBACK_SPAN_NAME)  # by rollout id
    _verdict(judge, 1.0, event={sc.GEN_AI_RESPONSE_ID: "chatcmpl-unknown"})  # judges no rollout
    _verdict(judge, 1.0, event={sc.GEN_AI_CONVERSATION_ID: "c-unknown"})  # neither

    rows = store.sql("SELECT rollout_id, final_reward FROM rollouts").to_pylist()
    views = {r["rollout_id"]: r["final_reward"] for r in rows}
    assert views == {**_EXPECTED, "conversation:c-4": None}
    rewards = store.sql("SELECT rollout_id, arg_max(value, [ingested_ns, time_ns]) AS v, count(*) AS n FROM rewards "
                        "GROUP BY rollout_id").to_pylist()
    assert {r["rollout_id"]: r["v"] for r in rewards} == {**_EXPECTED, None: 1.0}  # the three unresolved: no rollout
    assert {r["rollout_id"]: r["n"] for r in rewards}["conversation:c-3"] == 2

    out = subprocess.run([sys.executable, "-m", "spanrl", "sql", "--url", collector.http_endpoint, "-f", "json",
                          "SELECT rollout_id, final_reward FROM rollouts WHERE final_reward IS NOT NULL"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert {r["rollout_id"]: r["final_reward"] for r in json.loads(out.stdout)} == _EXPECTED

    try:
        page = index.query(RolloutFilter())
        assert page == RolloutIndex(source).query(RolloutFilter())  # incrementally as from scratch
    finally:
        source.close()
    assert {r["rollout_id"]: r["final_reward"] for r in page["rows"]} == {**_EXPECTED, "conversation:c-4": None}

    batch = load_transitions(store, rollout_ids=sorted(_EXPECTED))  # kept rollouts a verdict made dirty read live
    assert batch.rewards_by_rollout == _EXPECTED
    materialize(store)
    assert load_transitions(store, rollout_ids=sorted(_EXPECTED)).rewards_by_rollout == _EXPECTED

    ready = ready_rollouts(store, Watermark(), now=now_ns(store), settle_s=0.0, max_age_s=60.0, horizon_ns=0,
                           quiet_s=0.0)
    assert {r.rollout_id: r.reward for r in ready} == _EXPECTED
    assert {r.rollout_id: r.feedback_count for r in ready}["conversation:c-3"] == 2
