"""``SPANRL_CAPTURE=lean`` end to end: the same agent under ``opentelemetry-instrument`` with the full and the
lean profile, spans to a real ``spanrl collector``, requests to a scripted OpenAI-compatible server. Lean
records no LLM span of its own but keeps what training needs beside the policy server's record of the
call: ``traceparent`` and ``baggage`` on the request, the rollout, tool and reward spans. ~10 s a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeOpenAI

BIN = Path(sys.executable).parent
_AGENT = """
import openai, spanrl
client = openai.OpenAI()
with spanrl.rollout(rollout_id="r-lean", task_id="t-1"):
    answer = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "2+3?"}])
    spanrl.emit_tool_call("add", {"a": 2, "b": 3}, 5)
    spanrl.emit_reward(1.0 if answer.choices[0].message.content == "5" else 0.0)
"""


@pytest.mark.parametrize("capture", ["full", "lean"])
def test_lean_capture_keeps_context_tools_and_rewards_and_drops_the_llm_span(capture: str, collector_proc: Any,
                                                                             tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(_AGENT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SPANRL_", "TRACELOOP_", "OPENAI_"))}
    with FakeOpenAI(reply="5") as server:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{collector_proc.grpc_endpoint}", OPENAI_API_KEY="sk-test",
                   OPENAI_BASE_URL=server.base_url, SPANRL_CAPTURE=capture, PYTHONUNBUFFERED="1")
        out = subprocess.run([str(BIN / "opentelemetry-instrument"), str(BIN / "python"), str(agent)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        (request,) = [r for r in server.requests if r.path.endswith("/chat/completions")]
    rows = collector_proc.sql("SELECT name, operation_name, trace_id, rollout_id, reward_value FROM spans "
                              "ORDER BY start_ns")
    llm = [r for r in rows if r["operation_name"] == "chat"]
    assert len(llm) == (0 if capture == "lean" else 1), rows
    (reward,) = [r for r in rows if r["reward_value"] is not None]
    assert reward["rollout_id"] == "r-lean" and reward["reward_value"] == 1.0
    assert [r["rollout_id"] for r in rows if r["operation_name"] == "execute_tool"] == ["r-lean"]
    # the request names the agent's trace and rollout, so the policy server's span joins them
    assert request.headers["traceparent"].split("-")[1] == reward["trace_id"]
    assert "spanrl.rollout.id=r-lean" in request.headers["baggage"]
