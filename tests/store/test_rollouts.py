"""One attribution rule and one status rule (store/views.sql), seen the same way by the SQL views, the
decomposer and the Trainer's readiness check (store/rollouts.py); spans go through the real collector."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from opentelemetry.trace import SpanKind

from spanrl import semconv as sc
from spanrl.store import SpanStore
from spanrl.store import rollouts as store_rollouts
from spanrl.store.decomposer import decompose
from spanrl.store.kept_rollouts import materialize
from spanrl.rollouts.runner import RolloutJob, RolloutRunner, RunnerConfig

from test_decomposer import Recorder, Rollout, _ns, deliver, rows

REPO = Path(__file__).resolve().parents[2]


def _view(collector: Any, rollout_id: str) -> dict[str, Any]:
    found = collector.store.sql("SELECT * FROM rollouts WHERE rollout_id = ?", [rollout_id]).to_pylist()
    assert len(found) == 1, found
    return found[0]


def test_ids_only_on_the_rollout_span_views_agree_with_the_decomposer(collector: Any) -> None:
    # Conventions section 1: the ids on the root spanrl.rollout span only (baggage not copied onto spans).
    rec = Recorder()
    r = Rollout(rec, "root-only")
    plain = rec.tracer("agent")  # no rollout resource
    r.agent = plain
    root = rec.span(plain, sc.ROLLOUT_SPAN_NAME, start_ns=_ns(0), end_ns=_ns(100),
                    attributes={sc.ROLLOUT_ID: "root-only"})
    r.call(root, 10, [1, 2], [3])
    r.reward(root, 50, 0.25)
    r.evaluation_event(root, 60, 0.75, "judge")
    deliver(collector, rec.spans())

    view = _view(collector, "root-only")
    assert ((view["status"], view["ended_by"], view["reward_count"], view["final_reward"])
            == ("finished", "rollout_span", 2, 0.75))
    by_view = sorted(rows(collector.store.sql("SELECT name, value FROM rewards WHERE rollout_id = 'root-only'"),
                          "name", "value"))
    dec = decompose(collector.store)
    assert sorted(rows(dec.rewards, "name", "value")) == by_view == [("judge", 0.75), ("reward", 0.25)]
    assert rows(dec.rollouts, "rollout_id", "status", "ended_by") == [("root-only", "finished", "rollout_span")]


def test_trace_without_ids_joins_the_rollout_of_its_call_by_response_id(collector: Any) -> None:
    # An agent that sends no traceparent (openai-v2 instrumentor) and has no ids at all: the server span
    # (rollout id from the URL path) is in a trace of its own; the response id links the two.
    rec = Recorder()
    r = Rollout(rec, "by-response-id")
    plain = rec.tracer("plain-agent")
    r.agent = plain
    a = rec.span(plain, "invoke_agent bot", start_ns=_ns(0), end_ns=_ns(99),
                 attributes={sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT, sc.GEN_AI_AGENT_NAME: "bot"})
    r.call(a, 10, [1, 2], [3], propagate=False)
    r.reward(a, 50, 1.0)
    deliver(collector, rec.spans())

    view = _view(collector, "by-response-id")
    assert (view["final_reward"], view["reward_count"], view["status"]) == (1.0, 1, "open")
    dec = decompose(collector.store)
    assert rows(dec.calls, "rollout_id", "step", "agent", "prompt_ids") == [("by-response-id", 0, "bot", [1, 2])]
    assert rows(dec.rewards, "rollout_id", "value", "step") == [("by-response-id", 1.0, 0)]


def test_a_trace_naming_two_rollouts_attributes_its_unlabelled_spans_to_neither(collector: Any) -> None:
    rec = Recorder()
    plain = rec.tracer("plain-agent")
    root = rec.span(plain, "main", start_ns=_ns(0), end_ns=_ns(100))
    for rid in ("r-a", "r-b"):
        rec.span(plain, sc.ROLLOUT_SPAN_NAME, start_ns=_ns(1), end_ns=_ns(2), parent=root,
                 attributes={sc.ROLLOUT_ID: rid})
    rec.span(plain, sc.REWARD_SPAN_NAME, start_ns=_ns(3), end_ns=_ns(3), parent=root, attributes={sc.REWARD_VALUE: 1.0})
    deliver(collector, rec.spans())

    assert collector.store.sql("SELECT rollout_id FROM rewards").to_pylist() == [{"rollout_id": None}]
    assert decompose(collector.store).rewards.num_rows == 0


def test_two_instrumentors_one_call_one_step_and_counted(collector: Any) -> None:
    # openai-v2 and OpenLLMetry both wrap the client: an outer and an inner client span, same response id.
    rec = Recorder()
    r = Rollout(rec, "doubled")
    root = r.root(0, 100)
    for n, start in enumerate((10, 40)):
        outer = rec.span(r.agent, "chat policy", start_ns=_ns(start - 1), end_ns=_ns(start + 11), parent=root,
                         kind=SpanKind.CLIENT, attributes={sc.GEN_AI_OPERATION_NAME: sc.OP_CHAT,
                                                           sc.GEN_AI_RESPONSE_ID: f"chatcmpl-doubled-{n + 1}"})
        r.call(outer, start, [1, n], [2, n])
    r.reward(root, 90, 1.0)
    deliver(collector, rec.spans())

    dec = decompose(collector.store)
    assert rows(dec.calls, "step", "prompt_ids") == [(0, [1, 0]), (1, [1, 1])]
    assert rows(dec.rollouts, "duplicate_calls") == [(2,)]
    assert dec.report["duplicate_calls"] == 2


def test_status_without_a_rollout_span_open_then_ended_by_the_trainer(collector: Any, tmp_path: Path) -> None:
    rec = Recorder()
    for rid in ("exited", "crashed", "quiet", "running"):
        r = Rollout(rec, rid)
        r.call(None, 10, [1], [2])
        r.reward(None, 50, 1.0)
    deliver(collector, rec.spans())
    assert {r["status"] for r in collector.store.sql("SELECT status FROM rollouts").to_pylist()} == {"open"}

    store_rollouts.record_end(collector.store, "exited", "agent_exit")
    store_rollouts.record_end(collector.store, "crashed", "crashed", error="exit code 3")
    status = {r["rollout_id"]: (r["status"], r["ended_by"]) for r in collector.store.sql("FROM rollouts").to_pylist()}
    assert status == {"exited": ("finished", "agent_exit"), "crashed": ("error", "crashed"),
                      "quiet": ("open", None), "running": ("open", None)}
    assert store_rollouts.ready(collector.store, ["exited", "quiet", "running"], 0, need_token_ids=True) == {"exited"}

    # The collector's materializer keeps finished rollouts (its first run is 2 s after start, so only a test
    # slowed by load used to reach it): run it here, so every run reads the kept rows, and where the open
    # rollouts start, as a loaded one did.
    materialize(collector.store)
    collector.shutdown()
    with SpanStore.open(tmp_path / "spans.duckdb") as store:  # a minute passes for "quiet" only:
        # its spans were stored a minute earlier, so the start of it the materializer noted was too (the
        # decomposer reads open rollouts live from there; ingested_ns never moves back outside this test)
        for table, column in (("spans", "ingested_ns"), ("decomposed", "first_ingested_ns")):
            store.sql(f"UPDATE {table} SET {column} = {column} - 61_000_000_000 WHERE rollout_id = 'quiet'")
        status = {r["rollout_id"]: (r["status"], r["ended_by"]) for r in store.sql("FROM rollouts").to_pylist()}
        assert status["quiet"] == ("finished", "quiet") and status["running"] == ("open", None)
        assert "quiet" not in store_rollouts.ready(store, ["quiet"], 0, need_token_ids=False)  # no end stored
        assert {r["rollout_id"]: r["status"] for r in decompose(store).rollouts.to_pylist()}["quiet"] == "finished"


def test_in_process_agent_is_ready_only_with_its_late_span_stored(collector: Any) -> None:
    # The reward is exported early; the agent's invoke_agent span ends last and sits in the batch
    # processor when the agent returns. Readiness waits for the rollout span, after flushing.
    from spanrl.instrumentation import emit_reward
    from spanrl.instrumentation._rollout import tracer
    from spanrl.rollouts.tracing import InProcessTracing

    def agent(task: Any, llm: Any) -> None:
        with tracer().start_as_current_span("invoke_agent late",
                                            attributes={sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
                                                                          sc.GEN_AI_AGENT_NAME: "late"}):
            emit_reward(1.0)
            time.sleep(0.5)  # the reward leaves the batch processor meanwhile (100 ms delay)

    InProcessTracing.point_at(f"http://{collector.grpc_endpoint}")
    runner = RolloutRunner(
        agent, config=RunnerConfig(require_token_spans=False),
        ready=lambda ids, since: store_rollouts.ready(collector.store, ids, since, need_token_ids=False),
    )
    try:
        results = runner.run([RolloutJob(str(i), {}) for i in range(3)], id_prefix="late-", llm_url="http://x",
                             model="m", sampling={})
        stored = collector.store.sql(
            "SELECT rollout_id FROM spans WHERE name = 'invoke_agent late' ORDER BY rollout_id").to_pylist()
    finally:
        runner.close()
        InProcessTracing.point_at(None)
    assert [r.status for r in results] == ["ok"] * 3
    assert [s["rollout_id"] for s in stored] == ["late-0-a1", "late-1-a1", "late-2-a1"]


_PLAIN_OTEL_AGENT = textwrap.dedent(
    """
    # No spanrl: the OTel SDK configured from the standard environment only.
    import json, os
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    provider = TracerProvider(resource=Resource.create())  # reads OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    task = json.loads(os.environ["SPANRL_TASK"])
    with provider.get_tracer("plain").start_as_current_span("evaluate") as span:
        span.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "reward",
                                                    "gen_ai.evaluation.score.value": task["score"]})
    provider.shutdown()
    if task["score"] < 0:
        raise SystemExit(2)
    """
)


def test_command_agent_without_spanrl_gets_its_ids_and_its_end_stored(collector: Any, tmp_path: Path) -> None:
    script = tmp_path / "plain_agent.py"
    script.write_text(_PLAIN_OTEL_AGENT)
    runner = RolloutRunner(
        [sys.executable, str(script)],
        config=RunnerConfig(instrument=False, require_token_spans=False, max_attempts=1,
                            env={"OTEL_RESOURCE_ATTRIBUTES": "team=rl,spanrl.task.id=stale",
                                 "OTEL_SERVICE_NAME": "plain-agent"}),
        ready=lambda ids, since: store_rollouts.ready(collector.store, ids, since, need_token_ids=False),
        otel_env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.grpc_endpoint}",
                  "OTEL_EXPORTER_OTLP_INSECURE": "true"},
        on_end=lambda ends: store_rollouts.record_ends(collector.store, ends),
    )
    try:
        results = runner.run([RolloutJob("task one", {"score": 0.5}), RolloutJob("t2", {"score": -1.0})],
                             id_prefix="plain-", llm_url="http://x", model="m", sampling={})
    finally:
        runner.close()
    assert sorted((r.rollout_id, r.status) for r in results) == [("plain-0-a1", "ok"), ("plain-1-a1", "crashed")]
    spans = collector.store.sql(
        "SELECT rollout_id, task_id, attempt, mode, service_name, resource ->> '$.team' AS team FROM spans "
        "WHERE name = 'evaluate' ORDER BY rollout_id").to_pylist()
    assert spans == [
        {"rollout_id": "plain-0-a1", "task_id": "task one", "attempt": 1, "mode": "train",
         "service_name": "plain-agent", "team": "rl"},
        {"rollout_id": "plain-1-a1", "task_id": "t2", "attempt": 1, "mode": "train", "service_name": "plain-agent",
         "team": "rl"},
    ]
    view = {r["rollout_id"]: (r["status"], r["ended_by"], r["final_reward"]) for r in
            collector.store.sql("FROM rollouts WHERE rollout_id LIKE 'plain-%'").to_pylist()}
    assert view == {"plain-0-a1": ("finished", "agent_exit", 0.5), "plain-1-a1": ("error", "crashed", -1.0)}


def test_command_agent_gets_a_service_name_from_its_script_unless_the_user_set_one(collector: Any,
                                                                                    tmp_path: Path) -> None:
    script = tmp_path / "plain_agent.py"
    script.write_text(_PLAIN_OTEL_AGENT)
    names = {}
    for prefix, env in (("auto-", {}), ("own-", {"OTEL_RESOURCE_ATTRIBUTES": "service.name=my-agent"})):
        runner = RolloutRunner(
            [sys.executable, "-u", str(script)],
            config=RunnerConfig(instrument=False, require_token_spans=False, max_attempts=1, env=env),
            ready=lambda ids, since: store_rollouts.ready(collector.store, ids, since, need_token_ids=False),
            otel_env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{collector.grpc_endpoint}",
                      "OTEL_EXPORTER_OTLP_INSECURE": "true"},
        )
        try:
            runner.run([RolloutJob("t", {"score": 0.5})], id_prefix=prefix, llm_url="http://x", model="m", sampling={})
        finally:
            runner.close()
        names[prefix] = collector.store.sql(
            f"SELECT DISTINCT service_name FROM spans WHERE rollout_id LIKE '{prefix}%'").to_pylist()
    assert names == {"auto-": [{"service_name": "plain_agent"}], "own-": [{"service_name": "my-agent"}]}


def test_agent_service_name_is_the_script_module_or_program() -> None:
    from spanrl.rollouts.agent_env import agent_service_name

    assert agent_service_name(["opentelemetry-instrument", "python3", "-u", "agents/calc.py", "--fast"]) == "calc"
    assert agent_service_name(["/usr/bin/python3.12", "-m", "examples.calculator.agent"]) == "examples.calculator.agent"
    assert agent_service_name(["node", "agent.js"]) == "agent"
    assert agent_service_name(["./my-agent", "tasks.json"]) == "my-agent"
    assert agent_service_name(["python", "-c", "print(1)"]) == "python"
