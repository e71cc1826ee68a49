"""vLLM serves the same policy as the transformers backend: ``spanrl serve --backend vllm`` (a process in
``.venv-vllm``, whose transformers pin differs from spanrl's) against the transformers backend here on the
same weights: greedy token ids identical, log-probs within ``LOGPROB_TOLERANCE``; reload over HTTP
changes the output and bumps the version.

Needs ``make vllm-venv`` (``make test-vllm`` builds it and runs this module); skipped without it.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from spanrl.serving import PolicyServer, ServerConfig

REPO = pathlib.Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
LOGPROB_TOLERANCE = 1e-4
"""Largest |vLLM - transformers| log-prob of the same greedy tokens (float32, CPU)."""
PROMPTS = [[{"role": "user", "content": f"what is {i} add {3 * i} ?" + " the" * (i % 4)}] for i in range(8)]
START_TIMEOUT_S = 300.0

pytestmark = pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs .venv-vllm: run `make test-vllm`")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ADMIN_TOKEN = "vllm-reload-s3cret"


@pytest.fixture
def vllm_server(tiny_model_dir: pathlib.Path, tmp_path: pathlib.Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``spanrl serve --backend vllm`` on the tiny model, as a process; yields its root URL. Its reload route
    is on: ``ADMIN_TOKEN`` in a token file, the session's temporary folder as the checkpoint root."""
    port = _free_port()
    log = tmp_path / "serve.log"
    (tmp_path / "admin.token").write_text(ADMIN_TOKEN + "\n")
    command = [
        str(VLLM_PYTHON), "-m", "spanrl", "serve", "--backend", "vllm", "--model", str(tiny_model_dir),
        "--served-model-name", "tiny", "--port", str(port), "--otlp-endpoint", "none",
        "--admin-token-file", str(tmp_path / "admin.token"), "--checkpoint-root", str(tmp_path_factory.getbasetemp()),
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=REPO)
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
        yield base
    finally:
        proc.terminate()
        proc.wait(60)


def _greedy(base: str, messages: list[dict], max_tokens: int = 24) -> dict:
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_greedy_completions_are_token_identical_to_the_transformers_backend(vllm_server: str,
                                                                            tiny_model_dir: pathlib.Path) -> None:
    with PolicyServer(ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny")) as hf:
        expected = [_greedy(hf.base_url, p) for p in PROMPTS]
    got = [_greedy(vllm_server, p) for p in PROMPTS]
    assert [g["prompt_token_ids"] for g in got] == [e["prompt_token_ids"] for e in expected]
    assert [g["choices"][0]["token_ids"] for g in got] == [e["choices"][0]["token_ids"] for e in expected]
    assert sum(len(g["choices"][0]["token_ids"]) for g in got) >= 8 * 4  # real completions, not empty ones
    pairs = [(a, b) for g, e in zip(got, expected)
             for a, b in zip(g["choices"][0]["token_logprobs"], e["choices"][0]["token_logprobs"])]
    assert len(pairs) == sum(len(g["choices"][0]["token_ids"]) for g in got)  # one log-prob per token
    worst = max(abs(a - b) for a, b in pairs)
    print(f"largest log-prob difference vLLM vs transformers: {worst:.2e} over {len(pairs)} tokens")
    assert worst <= LOGPROB_TOLERANCE


def test_reload_over_http_changes_the_output_and_the_version(vllm_server: str,
                                                             tiny_model_dir_other: pathlib.Path) -> None:
    before = _greedy(vllm_server, PROMPTS[1], max_tokens=8)
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    reply = httpx.post(f"{vllm_server}/v1/weights/reload", json={"path": str(tiny_model_dir_other)}, headers=admin,
                       timeout=300)
    assert reply.status_code == 200 and reply.json()["policy_version"] == 1
    after = _greedy(vllm_server, PROMPTS[1], max_tokens=8)
    assert (before["policy_version"], after["policy_version"]) == (0, 1)
    assert after["choices"][0]["token_ids"] != before["choices"][0]["token_ids"]
    with PolicyServer(ServerConfig(model=tiny_model_dir_other, port=0, otlp_endpoint=None,
                                   served_model_name="tiny")) as hf:
        assert (_greedy(hf.base_url, PROMPTS[1], max_tokens=8)["choices"][0]["token_ids"]
                == after["choices"][0]["token_ids"])
    bad = httpx.post(f"{vllm_server}/v1/weights/reload", json={"path": "/nonexistent/weights"}, headers=admin,
                     timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "path"
    assert httpx.get(f"{vllm_server}/health", timeout=30).json()["policy_version"] == 1
