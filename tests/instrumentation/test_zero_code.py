"""Zero-code instrumentation end to end: `opentelemetry-instrument python agent.py` against a scripted
OpenAI-compatible server, spans over OTLP/gRPC to a real `spanrl collector` subprocess, checked in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from fake_openai import FakeOpenAI
from spanrl import semconv

AGENTS = Path(__file__).parent / "agents"
BIN = Path(sys.executable).parent
_AGENT_TIMEOUT_S = 120


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _agent_env(collector: Any, server: FakeOpenAI, rollout_id: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPANRL_", "TRACELOOP_", "OPENAI_"))}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{collector.grpc_endpoint}",
        OPENAI_API_KEY="sk-test",
        OPENAI_BASE_URL=f"{server.url}/rollouts/{rollout_id}/v1" if rollout_id else server.base_url,
        PYTHONUNBUFFERED="1",
    )
    if rollout_id:
        env.update(SPANRL_ROLLOUT_ID=rollout_id, SPANRL_TASK_ID="task-7", SPANRL_ATTEMPT="1")
    env.update(extra)
    return env


def _run_agent(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "opentelemetry-instrument"), str(BIN / "python"), str(AGENTS / script), *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=_AGENT_TIMEOUT_S)
    assert out.returncode == 0, f"agent failed:\n{out.stdout}\n{out.stderr}"
    return out


def _spans(collector: Any, where: str = "TRUE") -> list[dict[str, Any]]:
    rows = collector.sql(
        "SELECT name, kind, trace_id, span_id, parent_span_id, service_name, rollout_id, task_id, attempt, mode,"
        " agent_name, operation_name, response_id, reward_value, reward_name, attributes, resource"
        f" FROM spans WHERE {where} ORDER BY start_ns"
    )
    for row in rows:
        row["attributes"] = _json(row["attributes"])
        row["resource"] = _json(row["resource"])
    return rows


def _check_chat_and_reward(rows: list[dict[str, Any]], rollout_id: str, model: str = "tiny-calc") -> None:
    chats = [r for r in rows if r["operation_name"] == "chat"]
    assert len(chats) == 1, [r["name"] for r in rows]
    chat = chats[0]
    assert chat["kind"] == "CLIENT"
    assert chat["rollout_id"] == rollout_id and chat["task_id"] == "task-7" and chat["attempt"] == 1
    assert chat["response_id"].startswith("chatcmpl-fake-")
    attrs = chat["attributes"]
    assert attrs[semconv.GEN_AI_REQUEST_MODEL] == model
    inputs = _json(attrs[semconv.GEN_AI_INPUT_MESSAGES])
    assert [m["role"] for m in inputs] == ["system", "user"]
    assert inputs[1]["parts"][0]["content"] == "What is 2 + 3?"
    outputs = _json(attrs[semconv.GEN_AI_OUTPUT_MESSAGES])
    assert outputs[0]["parts"][0]["content"] == "5"
    assert attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] > 0 and attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == 1
    rewards = [r for r in rows if r["reward_value"] is not None]
    assert [(r["name"], r["reward_value"], r["reward_name"], r["rollout_id"]) for r in rewards] == [
        (semconv.REWARD_SPAN_NAME, 1.0, "reward", rollout_id)
    ]


def test_openai_agent_under_opentelemetry_instrument(collector_proc):
    with FakeOpenAI(reply="5") as server:
        env = _agent_env(collector_proc, server, "r-openai", OTEL_PYTHON_DISTRO="spanrl",
                         OTEL_PYTHON_CONFIGURATOR="spanrl")
        out = _run_agent("openai_agent.py", env)
        assert "answer: 5" in out.stdout
        assert server.requests[0].path == "/rollouts/r-openai/v1/chat/completions"
        assert server.requests[0].headers["traceparent"].startswith("00-")
    rows = _spans(collector_proc)
    _check_chat_and_reward(rows, "r-openai")
    chat = next(r for r in rows if r["operation_name"] == "chat")
    assert chat["service_name"] == "spanrl-agent"
    assert chat["resource"][semconv.ROLLOUT_ID] == "r-openai"  # a resource attribute, from SPANRL_ROLLOUT_ID
    assert chat["resource"][semconv.MODE] == "train" and chat["mode"] == "train"


def test_langchain_agent_under_opentelemetry_instrument(collector_proc):
    with FakeOpenAI(reply="5") as server:
        env = _agent_env(collector_proc, server, "r-langchain", OTEL_SERVICE_NAME="lc-agent")
        out = _run_agent("langchain_agent.py", env)
        assert "answer: 5" in out.stdout
    rows = _spans(collector_proc)
    _check_chat_and_reward(rows, "r-langchain")
    assert {r["service_name"] for r in rows} == {"lc-agent"}


def test_beside_opentelemetry_distro_rollout_ids_still_arrive(collector_proc):
    """The stock distro and configurator chose the SDK setup; the spanrl instrumentor stamps the ids."""
    with FakeOpenAI(reply="5") as server:
        env = _agent_env(
            collector_proc, server, "r-stock",
            OTEL_PYTHON_DISTRO="distro", OTEL_PYTHON_CONFIGURATOR="configurator",
            OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
        )
        _run_agent("openai_agent.py", env)
    rows = _spans(collector_proc)
    _check_chat_and_reward(rows, "r-stock")
    chat = next(r for r in rows if r["operation_name"] == "chat")
    assert semconv.ROLLOUT_ID not in chat["resource"]
    assert chat["attributes"][semconv.ROLLOUT_ID] == "r-stock"


def test_long_lived_agent_rollouts_carry_ids_in_spans_and_baggage(collector_proc):
    with FakeOpenAI(reply="5") as server:
        env = _agent_env(collector_proc, server, None)
        _run_agent("server_agent.py", env, "r-a", "r-b")
        baggage_headers = [r.headers.get("baggage", "") for r in server.requests]
    assert [("spanrl.rollout.id=r-a" in b, "spanrl.rollout.id=r-b" in b) for b in baggage_headers] == [
        (True, False),
        (False, True),
    ]
    rows = _spans(collector_proc)
    for rollout_id in ("r-a", "r-b"):
        mine = [r for r in rows if r["rollout_id"] == rollout_id]
        names = sorted(r["name"] for r in mine)
        assert names == sorted(
            ["spanrl.rollout", "invoke_agent solver", "openai.chat", "execute_tool check", "spanrl.reward",
             "spanrl.reward"]
        ), names
        assert all(r["task_id"] == f"task-{rollout_id}" for r in mine)
        root = next(r for r in mine if r["name"] == semconv.ROLLOUT_SPAN_NAME)
        assert root["parent_span_id"] is None and {r["trace_id"] for r in mine} == {root["trace_id"]}
        agent = next(r for r in mine if r["operation_name"] == "invoke_agent")
        chat = next(r for r in mine if r["operation_name"] == "chat")
        assert agent["agent_name"] == "solver" and chat["parent_span_id"] == agent["span_id"]
        assert sorted((r["reward_name"], r["reward_value"]) for r in mine if r["reward_value"] is not None) == [
            ("correct", 1.0),
            ("format", 0.5),
        ]


def test_async_streaming_and_sync_in_loop_calls_are_captured(collector_proc):
    with FakeOpenAI(reply="5") as server:
        env = _agent_env(collector_proc, server, "r-async")
        out = _run_agent("async_stream_agent.py", env)
        assert "answers: ['5', '5', '5']" in out.stdout
    rows = _spans(collector_proc)
    chats = [r for r in rows if r["operation_name"] == "chat"]
    prompts = sorted(_json(c["attributes"][semconv.GEN_AI_INPUT_MESSAGES])[0]["parts"][0]["content"] for c in chats)
    assert prompts == ["plain 2+3", "stream 2+3", "sync 2+3"]
    for chat in chats:
        assert chat["rollout_id"] == "r-async"
        assert _json(chat["attributes"][semconv.GEN_AI_OUTPUT_MESSAGES])[0]["parts"][0]["content"] == "5"
    streamed = next(c for c in chats if "stream" in c["attributes"][semconv.GEN_AI_INPUT_MESSAGES])
    assert streamed["attributes"]["gen_ai.is_streaming"] is True
    assert [r["reward_value"] for r in rows if r["reward_value"] is not None] == [1.0]


def test_http_protocol_choice_is_respected(collector_proc):
    """The user picked OTLP/HTTP: the distro keeps the standard exporter and the collector's HTTP port."""
    with FakeOpenAI(reply="5") as server:
        env = _agent_env(collector_proc, server, "r-http", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector_proc.http_endpoint
        _run_agent("openai_agent.py", env)
    _check_chat_and_reward(_spans(collector_proc), "r-http")
