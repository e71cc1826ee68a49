"""Framework matrix venvs: one virtual environment per framework, pinned, never with spanrl in it; built
once and kept under tests/frameworks/.venvs/ (git-ignored) until its pins change; pip uses its cache. A
framework whose install fails FAILS its test with pip's own words: it is never skipped silently."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

_OTEL = ["opentelemetry-distro==0.66b2", "opentelemetry-exporter-otlp-proto-grpc==1.45.2"]

FRAMEWORKS: dict[str, list[str]] = {
    # openai-v2 2.4b0 with openai 3.57 needs httpx and opentelemetry-util-genai==1.1b0
    "openai_v2": [*_OTEL, "opentelemetry-instrumentation-openai-v2==2.4b0", "opentelemetry-util-genai==1.1b0",
                  "openai==3.57.0", "httpx"],
    "openllmetry_async_stream": [*_OTEL, "opentelemetry-instrumentation-openai==0.62.4", "openai==3.57.0"],
    "handmade_spans": [*_OTEL, "httpx"],
    "langgraph_tool": [*_OTEL, "opentelemetry-instrumentation-openai==0.62.4", "openai==3.57.0", "langgraph==1.2.24",
                       "langchain-openai==1.7.4", "langchain-core==1.8.3"],
    "openai_agents_sdk": [*_OTEL, "opentelemetry-instrumentation-openai==0.62.4", "openai-agents==0.24.0",
                          "openai==3.57.0"],
    # the same SDK on its default model, OpenAIResponsesModel: POST /v1/responses
    "openai_agents_responses": [*_OTEL, "opentelemetry-instrumentation-openai==0.62.4", "openai-agents==0.24.0",
                                "openai==3.57.0"],
    # Anthropic's own client (POST /v1/messages) and its own OTel tracing, on by default since 2.x (a client span
    # per call, traceparent sent): OpenLLMetry's Anthropic instrumentor on top would double every call
    "anthropic_messages": [*_OTEL, "anthropic==2.15.0"],
    # LiteLLM: offline it needs LITELLM_LOCAL_MODEL_COST_MAP=True (the agent sets it); httpx instrumentation
    # carries traceparent, as no OpenAI instrumentor sees LiteLLM's requests
    "litellm_httpx": [*_OTEL, "opentelemetry-instrumentation-httpx==0.66b2", "litellm==1.110.2", "openai==3.57.0",
                      "httpx==0.28.1"],
    # both OpenAI instrumentors under the stock distro: two client spans per call, kept as one call
    "openai_v2_and_openllmetry": [*_OTEL, "opentelemetry-instrumentation-openai-v2==2.4b0",
                                  "opentelemetry-util-genai==1.1b0", "opentelemetry-instrumentation-openai==0.62.4",
                                  "openai==3.57.0", "httpx"],
}
"""Framework name -> pip requirements of its venv."""

AGENTS = {"openai_v2_and_openllmetry": "openai_v2"}
"""Framework name -> its agent, tests/frameworks/agents/<agent>.py (default: the framework's name)."""


HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"
_INSTALL_TIMEOUT_S = 900


def framework_venv(name: str) -> Path:
    """The venv of ``name`` with its pinned requirements, built when missing or stale."""
    reqs = FRAMEWORKS[name]
    venv = VENVS / name
    stamp = venv / ".requirements"
    want = hashlib.sha256("\n".join(reqs).encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == want:
        return _without_spanrl(name, venv)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=120)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs],
        capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        pytest.fail(f"framework {name!r}: pip install {' '.join(reqs)} failed (exit {proc.returncode}):\n{tail}",
                    pytrace=False)
    stamp.write_text(want)
    return _without_spanrl(name, venv)


def _without_spanrl(name: str, venv: Path) -> Path:
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import spanrl; print(spanrl.__file__)"],
                           capture_output=True, text=True, cwd=venv)
    assert check.returncode != 0, (f"framework {name!r}: its venv imports spanrl from {check.stdout.strip()}; "
                                   "it must not")
    return venv
