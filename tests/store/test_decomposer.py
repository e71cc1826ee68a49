"""The decomposer on span trees written with the OTel SDK and ingested through the real collector.

The helpers at the top (`Recorder`, `Rollout`, `deliver`) are also used by
tests/algorithms/test_transitions.py. Times are explicit, so every expectation is worked out by hand.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Sequence

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from spanrl import semconv as sc
from spanrl.errors import ConfigError
from spanrl.store.decomposer import Selection, decompose

T0_NS = 1_800_000_000_000_000_000
MS_NS = 1_000_000
POLICY_SERVICE = "spanrl-policy"


class Recorder:
    """Records span trees with the OTel SDK into memory; `deliver` sends them over OTLP gRPC later."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self._providers: list[TracerProvider] = []

    def tracer(self, service: str, **resource: Any) -> trace.Tracer:
        provider = TracerProvider(resource=Resource.create({sc.SERVICE_NAME: service, **resource}))
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self._providers.append(provider)
        return provider.get_tracer("spanrl-tests")

    @staticmethod
    def span(
        tracer: trace.Tracer,
        name: str,
        *,
        start_ns: int,
        end_ns: int | None = None,
        parent: trace.Span | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: dict[str, Any] | None = None,
        events: Sequence[tuple[str, int, dict[str, Any]]] = (),
        error: bool = False,
    ) -> trace.Span:
        """Start and end one span at the given times; returns it (usable as a parent)."""
        ctx = trace.set_span_in_context(parent) if parent is not None else trace.set_span_in_context(trace.INVALID_SPAN)
        span = tracer.start_span(name, context=ctx, kind=kind, attributes=attributes or {}, start_time=start_ns)
        for ev_name, ev_ns, ev_attrs in events:
            span.add_event(ev_name, ev_attrs, timestamp=ev_ns)
        if error:
            span.set_status(Status(StatusCode.ERROR, "failed"))
        span.end(end_time=end_ns if end_ns is not None else start_ns + MS_NS)
        return span

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


def missing_parent() -> trace.Span:
    """A parent that is never exported: its children are orphans."""
    ctx = SpanContext(trace_id=0xDEAD_BEEF << 64, span_id=0xBAD_C0DE, is_remote=True, trace_flags=TraceFlags(1))
    return NonRecordingSpan(ctx)


def deliver(collector: Any, spans: Sequence[ReadableSpan]) -> None:
    """Export ``spans`` in one OTLP/gRPC request; the collector acknowledges after commit."""
    exporter = OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)
    try:
        assert exporter.export(list(spans)) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()


@dataclass
class Rollout:
    """One rollout: the agent process (resource carries the rollout) and the policy server's spans."""

    rec: Recorder
    rollout_id: str
    task_id: str | None = "t1"
    mode: str = "train"
    server_skew_ns: int = 0  # the server clock minus the agent clock
    agent_service: str = "agent"
    agent: trace.Tracer = field(init=False)
    server: trace.Tracer = field(init=False)
    _n: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        resource = {sc.ROLLOUT_ID: self.rollout_id, sc.MODE: self.mode}
        if self.task_id is not None:
            resource[sc.TASK_ID] = self.task_id
        self.agent = self.rec.tracer(self.agent_service, **resource)
        self.server = self.rec.tracer(POLICY_SERVICE)

    def root(self, start_ms: float, end_ms: float, *, error: bool = False) -> trace.Span:
        return self.rec.span(self.agent, sc.ROLLOUT_SPAN_NAME, start_ns=_ns(start_ms), end_ns=_ns(end_ms), error=error)

    def invoke_agent(self, name: str, parent: trace.Span | None, start_ms: float, end_ms: float) -> trace.Span:
        attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: name}
        return self.rec.span(self.agent, f"invoke_agent {name}", start_ns=_ns(start_ms), end_ns=_ns(end_ms),
                             parent=parent, attributes=attrs)

    def call(
        self,
        parent: trace.Span | None,
        start_ms: float,
        prompt: list[int],
        completion: list[int],
        logprobs: list[float] | None = None,
        *,
        propagate: bool = True,
        client: bool = True,
        server: bool = True,
        version: int | None = 1,
        messages: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None,
        duration_ms: float = 10,
        compact: bool = False,
        error: bool = False,
        temperature: float | None = None,
        attributes: dict[str, Any] | None = None,
        server_attributes: dict[str, Any] | None = None,
    ) -> trace.Span | None:
        """An LLM call: the agent's client span [start, start + duration] (agent clock) and the policy
        server's span inside it (server clock), nested when ``propagate``, else in a trace of its own;
        ``attributes`` go on the client span, ``server_attributes`` on the server's."""
        self._n += 1
        response_id = f"chatcmpl-{self.rollout_id}-{self._n}"
        client_span = None
        if client:
            attrs: dict[str, Any] = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.GEN_AI_RESPONSE_ID: response_id,
                                     sc.GEN_AI_SYSTEM: "openai"}
            if messages is not None:
                attrs[sc.GEN_AI_INPUT_MESSAGES] = json.dumps(messages[0])
                attrs[sc.GEN_AI_OUTPUT_MESSAGES] = json.dumps(messages[1])
            attrs.update(attributes or {})  # e.g. spanrl.state.id, spanrl.label.good
            client_span = self.rec.span(self.agent, "openai.chat", start_ns=_ns(start_ms),
                                        end_ns=_ns(start_ms + duration_ms), parent=parent, kind=SpanKind.CLIENT,
                                        attributes=attrs)
        if server:
            lps = logprobs if logprobs is not None else [-0.5] * len(completion)
            attrs = {sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT, sc.GEN_AI_RESPONSE_ID: response_id,
                     sc.ROLLOUT_ID: self.rollout_id}
            if not error:  # a failed request records no tokens
                attrs.update({
                    sc.LLM_PROMPT_TOKEN_IDS: _b64(prompt, "<i4") if compact else prompt,
                    sc.LLM_COMPLETION_TOKEN_IDS: _b64(completion, "<i4") if compact else completion,
                    sc.LLM_LOGPROBS: _b64(lps, "<f4") if compact else lps})
            if version is not None:
                attrs[sc.POLICY_VERSION] = version
            if temperature is not None:
                attrs[sc.LLM_LOGPROBS_TEMPERATURE] = temperature
            attrs.update(server_attributes or {})
            srv_parent = client_span if (propagate and client_span is not None) else None
            self.rec.span(self.server, "chat tiny", start_ns=_ns(start_ms + 1) + self.server_skew_ns,
                          end_ns=_ns(start_ms + duration_ms - 1) + self.server_skew_ns, parent=srv_parent,
                          kind=SpanKind.SERVER, attributes=attrs, error=error)
        return client_span

    def reward(self, parent: trace.Span | None, at_ms: float, value: float, name: str | None = None) -> None:
        attrs: dict[str, Any] = {sc.REWARD_VALUE: value}
        if name is not None:
            attrs[sc.REWARD_NAME] = name
        self.rec.span(self.agent, sc.REWARD_SPAN_NAME, start_ns=_ns(at_ms), end_ns=_ns(at_ms), parent=parent,
                      attributes=attrs)

    def evaluation_event(self, parent: trace.Span | None, at_ms: float, value: float, name: str) -> None:
        attrs = {sc.GEN_AI_EVALUATION_NAME: name, sc.GEN_AI_EVALUATION_SCORE_VALUE: value}
        self.rec.span(self.agent, "evaluate", start_ns=_ns(at_ms), end_ns=_ns(at_ms + 1), parent=parent,
                      events=[(sc.GEN_AI_EVALUATION_RESULT_EVENT, _ns(at_ms), attrs)])


def _b64(values: list[int] | list[float], dtype: str) -> str:
    """The compact encoding of token arrays (spanrl/semconv.py): base64 of little-endian values."""
    return base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode()


def _ns(ms: float) -> int:
    return T0_NS + int(ms * MS_NS)


def rows(table: Any, *columns: str) -> list[tuple[Any, ...]]:
    return [tuple(r[c] for c in columns) for r in table.to_pylist()]


# --- tests -----------------------------------------------------------------------------------------


def test_multi_turn_calls_ordered_with_exact_ids_and_rewards_after_them(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "r1")
    root = r.root(0, 100)
    a = r.invoke_agent("solver", root, 1, 99)
    r.call(a, 10, [1, 2], [3], [-0.1])
    r.reward(a, 25, 0.25, name="format")  # after call 0 (ends at 20 ms), before call 1 ends
    r.call(a, 30, [1, 2, 3, 4], [5, 6], [-0.2, -0.3])
    r.call(a, 50, [1, 2, 3, 4, 5, 6, 7], [8], [-0.4])
    r.reward(a, 70, 1.0)
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    assert rows(dec.calls, "rollout_id", "step", "agent", "prompt_ids", "completion_ids", "policy_version",
                "task_id", "mode", "rollout_status", "rollout_calls") == [
        ("r1", 0, "solver", [1, 2], [3], 1, "t1", "train", "finished", 3),
        ("r1", 1, "solver", [1, 2, 3, 4], [5, 6], 1, "t1", "train", "finished", 3),
        ("r1", 2, "solver", [1, 2, 3, 4, 5, 6, 7], [8], 1, "t1", "train", "finished", 3),
    ]
    assert [pytest.approx(lp) for lp in dec.calls.column("logprobs").to_pylist()[1]] == [-0.2, -0.3]
    assert rows(dec.rewards, "name", "value", "step") == [("format", 0.25, 0), ("reward", 1.0, 2)]
    assert rows(dec.calls, "rewards_after") == [([("format", 0.25)],), ([],), ([("reward", 1.0)],)]
    assert dec.report["rollouts"] == 1 and dec.report["calls"] == 3
    # only the columns asked for (in the table's order, with the sort keys), the same rows in them
    few = decompose(collector.store, call_columns=["logprobs", "agent", "completion_ids"])
    assert few.calls.column_names == ["rollout_id", "agent", "step", "completion_ids", "logprobs"]
    assert few.calls.equals(dec.calls.select(few.calls.column_names))
    assert few.rewards.equals(dec.rewards) and few.rollouts.equals(dec.rollouts) and few.report == dec.report


def test_server_span_joined_by_response_id_across_traces_with_clock_skew(collector: Any) -> None:
    # The server clock runs 5 s ahead and trace context did not propagate. An external call (client
    # span only) happens between two policy calls: by raw times it would sort last; with the offset
    # estimated from the paired calls it sorts second.
    rec = Recorder()
    r = Rollout(rec, "skew", server_skew_ns=5_000 * MS_NS)
    root = r.root(0, 200)
    r.call(root, 10, [1], [2], propagate=False)
    ext = r.call(root, 40, [], [], server=False,
                 messages=([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}],
                           [{"role": "assistant", "parts": [{"type": "text", "content": "yo"}]}]))
    assert ext is not None
    r.call(root, 70, [1, 2, 3], [4], propagate=False)
    r.reward(root, 55, 0.5)  # agent clock: after the external call (ends 50), before call 3 (ends 80)
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    calls = dec.calls.to_pylist()
    assert [c["step"] for c in calls] == [0, 1, 2]
    assert [c["prompt_ids"] for c in calls] == [[1], None, [1, 2, 3]]
    assert calls[1]["client_span_id"] == format(ext.get_span_context().span_id, "016x")
    assert calls[1]["server_span_id"] is None
    assert json.loads(calls[1]["input_messages"])[0]["parts"][0]["content"] == "hi"
    assert all(c["client_span_id"] is not None for c in calls)  # each server span found its client span
    assert {c["clock_offset_ns"] for c in calls} == {5_001 * MS_NS}  # skew + 1 ms from client to server start
    assert rows(dec.rewards, "value", "step") == [(0.5, 1)]


def test_agent_is_nearest_invoke_agent_ancestor_and_selection_by_agent(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "multi")
    root = r.root(0, 300)
    planner = r.invoke_agent("planner", root, 1, 299)
    r.call(planner, 10, [1], [2])
    coder = r.invoke_agent("coder", planner, 30, 150)  # nested: nearest ancestor wins
    tool = rec.span(r.agent, "execute_tool run", start_ns=_ns(40), end_ns=_ns(100), parent=coder,
                    attributes={sc.GEN_AI_OPERATION_NAME: sc.OP_EXECUTE_TOOL})
    r.call(tool, 50, [3], [4])
    r.call(planner, 200, [5], [6])
    deliver(collector, rec.spans())

    everything = decompose(collector.store)
    only_coder = decompose(collector.store, Selection(agents=["coder"]))

    assert rows(everything.calls, "step", "agent") == [(0, "planner"), (1, "coder"), (2, "planner")]
    assert rows(only_coder.calls, "step", "agent", "prompt_ids", "rollout_calls") == [(1, "coder", [3], 3)]


def test_duplicates_out_of_order_and_late_spans_give_the_same_calls(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "messy")
    root = r.root(0, 100)
    a = r.invoke_agent("solver", root, 1, 99)
    r.call(a, 10, [1], [2])
    r.call(a, 30, [1, 2, 3], [4])
    r.reward(a, 60, 1.0)
    spans = rec.spans()
    root_span = [s for s in spans if s.name == sc.ROLLOUT_SPAN_NAME]
    others = [s for s in spans if s.name != sc.ROLLOUT_SPAN_NAME]
    deliver(collector, root_span)  # the rollout "ended" first; everything else arrives after it
    for s in reversed(others):  # children before parents, one request each
        deliver(collector, [s])
    deliver(collector, others)  # and the whole lot exported a second time

    dec = decompose(collector.store)

    assert rows(dec.calls, "step", "agent", "prompt_ids") == [(0, "solver", [1]), (1, "solver", [1, 2, 3])]
    assert rows(dec.rewards, "value", "step") == [(1.0, 1)]
    # stored rows: the root once, the 6 others twice; call and reward spans stored twice count as
    # duplicates (4 + 1); the 2 calls and the reward arrived after the rollout span
    assert rows(dec.rollouts, "rollout_id", "span_count", "duplicate_spans", "late_arrivals", "orphan_calls") == [
        ("messy", 1 + 2 * len(others), 5, 3, 0)
    ]
    assert dec.report["duplicate_spans"] == 5 and dec.report["late_arrivals"] == 3


def test_orphan_call_is_kept_without_agent_and_counted(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "orphan")
    root = r.root(0, 100)
    a = r.invoke_agent("solver", root, 1, 99)
    r.call(a, 10, [1], [2])
    lost = r.invoke_agent("helper", missing_parent(), 30, 60)  # its parent never arrives
    r.call(lost, 40, [7], [8])
    r.call(missing_parent(), 70, [9], [10])  # a call directly under a missing parent
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    assert rows(dec.calls, "step", "agent", "prompt_ids") == [(0, "solver", [1]), (1, "helper", [7]), (2, None, [9])]
    assert rows(dec.rollouts, "orphan_calls") == [(1,)]  # the last call: its chain breaks before any agent
    assert dec.report["orphan_calls"] == 1


def test_agent_and_orphans_through_chains_longer_than_the_unrolled_walk(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "deep")
    root = r.root(0, 300)
    chains = {"agent": r.invoke_agent("solver", root, 1, 299), "lost": missing_parent(), "bare": root}
    for depth in range(9):  # nine framework spans between each start and its call
        for name, parent in chains.items():
            chains[name] = rec.span(r.agent, f"{name} {depth}", start_ns=_ns(2 + depth), end_ns=_ns(290), parent=parent)
    r.call(chains["agent"], 20, [1], [2])  # reaches the agent
    r.call(chains["lost"], 60, [3], [4])  # breaks at a missing parent before any agent: an orphan
    r.call(chains["bare"], 120, [5], [6])  # reaches the root without an agent: no agent, not an orphan
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    assert rows(dec.calls, "step", "agent", "prompt_ids") == [(0, "solver", [1]), (1, None, [3]), (2, None, [5])]
    assert rows(dec.rollouts, "orphan_calls") == [(1,)]
    assert rows(decompose(collector.store, Selection(agents=["solver"])).calls, "prompt_ids") == [([1],)]


def test_rewards_from_spans_and_evaluation_events_by_name(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "rw")
    root = r.root(0, 100)
    r.call(root, 10, [1], [2])
    r.evaluation_event(root, 30, 0.8, "accuracy")
    r.reward(root, 40, 0.1, name="length")
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    assert rows(dec.rewards, "name", "value", "step", "source") == [
        ("accuracy", 0.8, 0, "event"),
        ("length", 0.1, 0, "span"),
    ]


def test_selection_by_mode_time_and_policy_version(collector: Any) -> None:
    rec = Recorder()
    early = Rollout(rec, "early", mode="train")
    early.call(early.root(0, 100), 10, [1], [2], version=1)
    late = Rollout(rec, "late", mode="val")
    root = late.root(1_000, 1_100)
    late.call(root, 1_010, [3], [4], version=1)
    late.call(root, 1_030, [5], [6], version=2)
    deliver(collector, rec.spans())
    store = collector.store

    assert rows(decompose(store, Selection(mode="val")).calls, "rollout_id", "step") == [("late", 0), ("late", 1)]
    assert rows(decompose(store, Selection(mode="train")).calls, "rollout_id") == [("early",)]
    assert rows(decompose(store, Selection(since_ns=_ns(500))).calls, "rollout_id", "step") == [
        ("late", 0), ("late", 1)]
    assert rows(decompose(store, Selection(until_ns=_ns(500))).calls, "rollout_id") == [("early",)]
    assert rows(decompose(store, Selection(min_policy_version=2)).calls, "rollout_id", "step", "policy_version") == [
        ("late", 1, 2)]
    assert rows(decompose(store, Selection(rollout_ids=["early"])).calls, "rollout_id") == [("early",)]


def test_rollout_status_finished_error_and_open(collector: Any) -> None:
    rec = Recorder()
    ok, bad, running = Rollout(rec, "ok"), Rollout(rec, "bad"), Rollout(rec, "running")
    ok.call(ok.root(0, 50), 10, [1], [2])
    bad.call(bad.root(0, 50, error=True), 10, [1], [2])
    running.call(None, 10, [1], [2])  # no rollout span (yet)
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    assert rows(dec.rollouts, "rollout_id", "status") == [("bad", "error"), ("ok", "finished"), ("running", "open")]
    assert dec.report["failed_rollouts"] == 1 and dec.report["open_rollouts"] == 1


def test_selection_rejects_bad_fields() -> None:
    with pytest.raises(ValueError, match="agents must be a sequence of strings, got 'coder'"):
        Selection(agents="coder").validate()
    with pytest.raises(ValueError, match=r"until_ns \(5\) must be greater than since_ns \(9\)"):
        Selection(since_ns=9, until_ns=5).validate()
    with pytest.raises(ValueError, match="min_policy_version must be an integer, got '2'"):
        Selection(min_policy_version="2").validate()  # type: ignore[arg-type]


def test_call_columns_rejects_an_unknown_column() -> None:
    with pytest.raises(ValueError, match="call_columns: no column 'prompt'; the calls' columns are rollout_id, "):
        decompose(None, call_columns=["step", "prompt"])  # type: ignore[arg-type]  # refused before any SQL


def test_compact_base64_token_arrays_read_like_plain_arrays(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "b64")
    root = r.root(0, 100)
    r.call(root, 10, [1, 70000, 3], [4, 5], [-0.25, -1.5], compact=True)
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    assert rows(dec.calls, "prompt_ids", "completion_ids", "logprobs") == [([1, 70000, 3], [4, 5], [-0.25, -1.5])]


def test_spans_without_rollout_id_inherit_it_from_their_trace(collector: Any) -> None:
    # An agent that knows nothing of spanrl: its only link to the rollout is the policy server span
    # (rollout id from the URL path) nested under its client span by W3C trace context.
    rec = Recorder()
    r = Rollout(rec, "zero-code")
    plain_agent = rec.tracer("plain-agent")  # no spanrl.rollout.id resource
    root = rec.span(plain_agent, "main", start_ns=_ns(0), end_ns=_ns(100))
    a = rec.span(plain_agent, "invoke_agent bot", start_ns=_ns(1), end_ns=_ns(99), parent=root,
                 attributes={sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "bot"})
    r.agent = plain_agent
    r.call(a, 10, [1, 2], [3])
    r.reward(a, 50, 0.75)
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    assert rows(dec.calls, "rollout_id", "step", "agent", "prompt_ids") == [("zero-code", 0, "bot", [1, 2])]
    assert rows(dec.rewards, "rollout_id", "value", "step") == [("zero-code", 0.75, 0)]


def test_two_equal_evaluation_events_are_two_rewards_and_a_second_export_adds_none(collector: Any) -> None:
    # Two gen_ai.evaluation.result events with the same name and value on one span, at different times,
    # are two rewards (e.g. a checker run after each of two calls); only a span exported twice repeats one.
    rec = Recorder()
    r = Rollout(rec, "twice")
    root = r.root(0, 100)
    r.call(root, 10, [1], [2])
    r.call(root, 40, [1, 2, 3], [4])
    attrs = {sc.GEN_AI_EVALUATION_NAME: "tests_pass", sc.GEN_AI_EVALUATION_SCORE_VALUE: 1.0}
    rec.span(r.agent, "checker", start_ns=_ns(25), end_ns=_ns(70), parent=root,
             events=[(sc.GEN_AI_EVALUATION_RESULT_EVENT, _ns(25), attrs),  # after call 0 (ends 20 ms)
                     (sc.GEN_AI_EVALUATION_RESULT_EVENT, _ns(60), attrs)])  # after call 1 (ends 50 ms)
    r.reward(root, 80, 0.5, name="style")  # a reward span: attribute and nothing else
    spans = rec.spans()
    deliver(collector, spans)
    deliver(collector, [s for s in spans if s.name in ("checker", sc.REWARD_SPAN_NAME)])  # exported again

    dec = decompose(collector.store)

    assert rows(dec.rewards, "name", "value", "step", "source") == [
        ("tests_pass", 1.0, 0, "event"), ("tests_pass", 1.0, 1, "event"), ("style", 0.5, 1, "span")]
    assert rows(dec.calls, "rewards_after") == [([("tests_pass", 1.0)],), ([("style", 0.5), ("tests_pass", 1.0)],)]
    assert rows(dec.rollouts, "duplicate_spans") == [(2,)]  # the checker and the reward span, once each


def test_reward_attribute_repeated_by_an_event_on_its_span_counts_once(collector: Any) -> None:
    rec = Recorder()
    r = Rollout(rec, "both")
    root = r.root(0, 100)
    r.call(root, 10, [1], [2])
    rec.span(r.agent, sc.REWARD_SPAN_NAME, start_ns=_ns(30), end_ns=_ns(30), parent=root,
             attributes={sc.REWARD_VALUE: 0.7, sc.REWARD_NAME: "reward"},
             events=[(sc.REWARD_SPAN_NAME, _ns(30), {sc.REWARD_VALUE: 0.7, sc.REWARD_NAME: "reward"})])
    deliver(collector, rec.spans())

    dec = decompose(collector.store)

    assert rows(dec.rewards, "name", "value", "source") == [("reward", 0.7, "event")]


# --- the decomposer's Python checks, each aimed at a mutant `make mutation` found surviving -------------
def test_selection_refuses_an_empty_time_window() -> None:
    with pytest.raises(ConfigError, match=r"^until_ns \(5\) must be greater than since_ns \(5\)$"):
        Selection(since_ns=5, until_ns=5).validate()
    Selection(since_ns=5, until_ns=6).validate()


def test_call_columns_must_be_names_and_the_first_unknown_is_named() -> None:
    from spanrl.store.decomposer import call_columns as _call_columns

    with pytest.raises(ConfigError, match="^call_columns must be a sequence of column names, got 'step'$"):
        _call_columns("step")
    with pytest.raises(ConfigError, match="^call_columns must be a sequence of column names, got \\['step', 3\\]$"):
        _call_columns(["step", 3])
    with pytest.raises(ConfigError, match="^call_columns: no column 'aaa'; "):
        _call_columns(["zzz", "aaa"])


def test_the_sql_file_spells_the_semconv_names_as_spanrl_semconv_does() -> None:
    """store/decomposer.sql writes span names and attribute keys out (as views.sql does): each one it spells is
    spanrl.semconv's value, and each constant it reads is there, so renaming a constant fails here."""
    text = resources.files("spanrl.store").joinpath("decomposer.sql").read_text(encoding="utf-8")
    sql = re.sub(r"--[^\n]*", "", text)  # the comments may name anything
    assert set(re.findall(r"""'\$\."([^"]+)"'""", sql)) == {  # JSON keys of span and event attributes
        sc.LLM_LOGPROBS_TEMPERATURE, sc.GEN_AI_REQUEST_TEMPERATURE, sc.GEN_AI_INPUT_MESSAGES, sc.GEN_AI_OUTPUT_MESSAGES,
        sc.GEN_AI_SYSTEM_INSTRUCTIONS, sc.GEN_AI_INPUT_MESSAGES_REF, sc.GEN_AI_OUTPUT_MESSAGES_REF,
        sc.GEN_AI_SYSTEM_INSTRUCTIONS_REF,
    }  # rewards are views.sql's rollout_rewards (the one verdict rule), but for a reward span without a value:
    assert set(re.findall(r"'((?:spanrl|gen_ai)\.[\w.]+)'", sql)) == {
        sc.REWARD_SPAN_NAME, sc.GEN_AI_INFERENCE_DETAILS_EVENT, sc.GEN_AI_CONTENT_STORAGE_RESULT_EVENT}
    assert re.findall(r"'(\w+)'\) AS name", sql) == [sc.DEFAULT_REWARD_NAME]  # a reward without a name
