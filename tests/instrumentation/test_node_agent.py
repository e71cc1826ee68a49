"""The Node.js example agent (OTel JS SDK, OTLP/gRPC) lands its spans and reward in the store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fake_openai import FakeOpenAI
from spanrl import semconv

NODE_AGENT = Path(__file__).resolve().parents[2] / "examples" / "node-agent"


@pytest.fixture(scope="module")
def node_agent() -> Path:
    if shutil.which("node") is None:
        pytest.skip("node is not installed (the Node.js agent needs Node >= 20)")
    if not (NODE_AGENT / "node_modules" / "@opentelemetry" / "sdk-node").is_dir():
        # `make test` runs `npm install` first; do it here for a bare `pytest`.
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_AGENT, check=True,
                       timeout=300)
    return NODE_AGENT


@pytest.mark.parametrize(("reply", "reward"), [("5", 1.0), ("six", 0.0)])
def test_node_agent_spans_and_reward_in_store(collector_proc, node_agent, reply, reward):
    rollout_id = f"r-node-{reward}"
    with FakeOpenAI(reply=reply) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPANRL_", "OPENAI_"))}
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{collector_proc.grpc_endpoint}",
            OPENAI_BASE_URL=f"{server.url}/rollouts/{rollout_id}/v1",
            OPENAI_API_KEY="sk-test",
            SPANRL_ROLLOUT_ID=rollout_id,
            SPANRL_TASK_ID="task-js",
            SPANRL_ATTEMPT="2",
        )
        out = subprocess.run(["node", "agent.js", "What is 2 + 3?", "5"], cwd=node_agent, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"answer: {reply}" in out.stdout
        assert server.requests[0].path == f"/rollouts/{rollout_id}/v1/chat/completions"
        traceparent = server.requests[0].headers["traceparent"]

    rows = collector_proc.sql(
        "SELECT name, span_id, trace_id, parent_span_id, service_name, rollout_id, task_id, attempt, agent_name,"
        " operation_name, response_id, reward_value, reward_name, attributes FROM spans ORDER BY start_ns"
    )
    by_op = {r["operation_name"]: r for r in rows if r["operation_name"]}
    assert set(by_op) == {"invoke_agent", "chat"}
    chat, agent = by_op["chat"], by_op["invoke_agent"]
    assert all(r["rollout_id"] == rollout_id and r["task_id"] == "task-js" and r["attempt"] == 2 for r in rows)
    assert {r["service_name"] for r in rows} == {"spanrl-node-agent"}
    assert agent["agent_name"] == "calculator" and chat["parent_span_id"] == agent["span_id"]
    assert traceparent.split("-")[1:3] == [chat["trace_id"], chat["span_id"]]
    assert chat["response_id"].startswith("chatcmpl-fake-")
    attrs = json.loads(chat["attributes"]) if isinstance(chat["attributes"], str) else chat["attributes"]
    assert json.loads(attrs[semconv.GEN_AI_OUTPUT_MESSAGES])[0]["parts"][0]["content"] == reply
    assert json.loads(attrs[semconv.GEN_AI_INPUT_MESSAGES])[1]["parts"][0]["content"] == "What is 2 + 3?"
    rewards = [r for r in rows if r["reward_value"] is not None]
    assert [(r["name"], r["reward_value"], r["reward_name"], r["parent_span_id"]) for r in rewards] == [
        (semconv.REWARD_SPAN_NAME, reward, "reward", agent["span_id"])
    ]
