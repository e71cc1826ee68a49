"""ATIF out and in (store/atif.py): `spanrl export trajectories --format atif` of rollouts the way the Trainer
stores them (the policy server's exact tokens and log-probs, an agent's messages and tool calls, rewards),
then `spanrl store import --format atif` into a fresh store: the same transitions, and nothing stored twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from spanrl import semconv as sc
from spanrl.algorithms.transitions import load_transitions
from spanrl.store import SpanStore


def _rollout(collector: Any, rollout_id: str, task: str, turns: list[tuple[list[int], list[int], list[float]]],
             rewards: list[tuple[int, float]]) -> None:
    """One rollout: an agent (invoke_agent 'solver') whose chat calls the policy server served, a tool call
    between turns, and a spanrl.reward span after the given calls."""
    provider = TracerProvider(resource=Resource.create({"service.name": "agent", sc.ROLLOUT_ID: rollout_id,
                                                        sc.TASK_ID: task, sc.ATTEMPT: 1}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.grpc_endpoint, insecure=True)))
    tracer = provider.get_tracer("agent")
    history = [{"role": "user", "parts": [{"type": "text", "content": f"solve {task}"}]}]
    with tracer.start_as_current_span(sc.ROLLOUT_SPAN_NAME), tracer.start_as_current_span(
            "invoke_agent solver", attributes={sc.GEN_AI_OPERATION_NAME: sc.OP_INVOKE_AGENT,
                                               sc.GEN_AI_AGENT_NAME: "solver"}):
        for k, (prompt, completion, logprobs) in enumerate(turns):
            out = [{"role": "assistant", "parts": [{"type": "text", "content": f"turn {k}"},
                                                   {"type": "tool_call", "id": f"call_{k}", "name": "calc",
                                                    "arguments": {"x": k}}]}]
            with tracer.start_as_current_span("chat tiny", kind=SpanKind.CLIENT, attributes={
                    sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_INPUT_MESSAGES: json.dumps(history),
                    sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(out)}) as client:
                tracer.start_span("chat tiny", context=trace.set_span_in_context(client), kind=SpanKind.SERVER,
                                  attributes={sc.GEN_AI_OPERATION_NAME: "chat",
                                              sc.GEN_AI_RESPONSE_ID: f"{rollout_id}-{k}", sc.POLICY_VERSION: 3,
                                              sc.LLM_PROMPT_TOKEN_IDS: prompt,
                                              sc.LLM_COMPLETION_TOKEN_IDS: completion, sc.LLM_LOGPROBS: logprobs,
                                              sc.LLM_LOGPROBS_TEMPERATURE: 0.7}).end()
            history = [*history, *out, {"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call_{k}",
                                                                   "response": str(k * 2)}]}]
            for step, value in rewards:
                if step == k:
                    tracer.start_span(sc.REWARD_SPAN_NAME, attributes={sc.REWARD_VALUE: value}).end()
    provider.shutdown()


def _spanrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spanrl", *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd)


def test_atif_round_trip_keeps_the_transitions(collector: Any, tmp_path: Path) -> None:
    _rollout(collector, "r-a", "t-1", [([1, 2, 3], [4, 5], [-0.5, -0.25]), ([1, 2, 3, 4, 5, 6], [7], [-1.5])],
             [(0, 0.25), (1, 1.0)])
    _rollout(collector, "r-b", "t-1", [([1, 2, 3], [9], [-2.0])], [(0, 0.0)])
    _rollout(collector, "r-c", "t-2", [([8, 8], [6, 6, 6], [-0.125, -0.0625, -0.03125])], [(0, 0.5)])
    original = load_transitions(collector.store).to_arrow()
    assert original.num_rows == 4

    out = tmp_path / "trajectories.json"
    done = _spanrl("export", "trajectories", "--format", "atif", "-o", str(out), "--url", collector.http_endpoint,
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    trajectories = json.loads(out.read_text())
    a = next(t for t in trajectories if t["session_id"] == "r-a")
    assert a["schema_version"] == "ATIF-v1.4" and a["agent"]["name"] == "solver" and a["extra"]["reward"] == 1.0
    assert [s["source"] for s in a["steps"]] == ["user", "agent", "agent"]
    assert a["steps"][1]["metrics"] == {"prompt_tokens": 3, "prompt_token_ids": [1, 2, 3], "completion_tokens": 2,
                                        "completion_token_ids": [4, 5], "logprobs": [-0.5, -0.25]}
    assert a["steps"][1]["tool_calls"] == [{"tool_call_id": "call_0", "function_name": "calc", "arguments": {"x": 0}}]
    assert a["steps"][1]["observation"] == {"results": [{"source_call_id": "call_0", "content": "0"}]}

    fresh = tmp_path / "fresh.duckdb"
    no_collector = "http://127.0.0.1:9"
    first = _spanrl("store", "import", str(out), "--format", "atif", "--db", str(fresh), "--url", no_collector,
                    cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "from 3 trajectories" in first.stdout and "0 rejected" in first.stdout
    again = _spanrl("store", "import", str(out), "--format", "atif", "--db", str(fresh), "--url", no_collector,
                    cwd=tmp_path)
    assert again.returncode == 0 and "imported 0 spans from 3 trajectories" in again.stdout, again.stderr
    with SpanStore.open(fresh, read_only=True) as store:
        assert load_transitions(store).to_arrow().equals(original)


def test_a_store_derived_rollout_id_comes_back_under_the_imported_prefix() -> None:
    """A production rollout's id (`conversation:<id>`, `trace:...`, `response:...`) is the store's own: no span may
    name one (the collector refuses it), so an exported one is imported as `imported:<id>`, not refused whole."""
    from spanrl.store.atif import atif_requests

    traj = {"session_id": "conversation:c-1", "steps": [{"source": "user", "message": "hi"},
                                                         {"source": "agent", "message": "hello"}],
            "extra": {"spanrl": {"rollout_id": "conversation:c-1"}}}
    resource = atif_requests(traj)[0]["resourceSpans"][0]["resource"]["attributes"]
    ids = [a["value"]["stringValue"] for a in resource if a["key"] == sc.ROLLOUT_ID]
    assert ids == ["imported:conversation:c-1"]
    assert not ids[0].startswith(sc.DERIVED_ROLLOUT_PREFIXES)
