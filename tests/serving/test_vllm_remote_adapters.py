"""Per-agent LoRA policies on a remote vLLM server: ``spanrl serve --backend vllm --max-loras 3 --max-lora-rank 8``
(a process in ``.venv-vllm``) started plain, the Trainer adds its three adapters, rollouts run on vLLM, the
update pushes only the adapters, and vLLM then answers each adapter with the Trainer's own server's (transformers)
greedy tokens and log-probs (``test_vllm_parity``'s tolerance). A server without LoRA slots is refused at start
with the flags to add. One LoRA policy (``algorithm.lora``) reaches vLLM as its adapter alone, served under the
model's own name. Whole weights sent in a request's body (``POST /v1/weights/load``) load in place on vLLM too.

Needs ``make vllm-venv`` (``make test-vllm`` runs this module); skipped without it.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import test_remote_adapters as remote
from test_remote_adapters import ADMIN, NAMES, greedy, lora_trainer, ports, tokens, trainer_on  # noqa: F401 - fixtures
from test_vllm_parity import LOGPROB_TOLERANCE, START_TIMEOUT_S, VLLM_PYTHON

from spanrl.demo.tiny import build_tiny_model
from spanrl.errors import ServingError

pytestmark = [pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="needs .venv-vllm: run `make test-vllm`"),
              pytest.mark.slow]


def serve_vllm(model: Path, root: Path, collector_port: int, *flags: str) -> tuple[subprocess.Popen, str]:
    """``spanrl serve --backend vllm`` as a user starts it beside a run (reload route on, spans to the collector)."""
    port = remote.free_port()
    (root / "admin.token").write_text(ADMIN + "\n")
    command = [str(VLLM_PYTHON), "-m", "spanrl", "serve", "--backend", "vllm", "--model", str(model),
               "--served-model-name", "policy", "--port", str(port), "--otlp-endpoint", f"127.0.0.1:{collector_port}",
               "--admin-token-file", str(root / "admin.token"), "--checkpoint-root", str(root), *flags]
    log = root / "vllm.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=remote.REPO,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc, f"http://127.0.0.1:{port}"
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)


@pytest.fixture
def vllm_model(tmp_path: Path) -> Path:
    """The calculator's vocabulary; head_dim 32: vLLM's CPU attention has no kernel for 16."""
    return build_tiny_model(tmp_path / "tiny", words=remote.calculator.vocabulary(), hidden_size=64, num_layers=1,
                            num_heads=2, intermediate_size=128)


def test_a_remote_vllm_server_serves_the_pushed_adapters(vllm_model: Path, tmp_path: Path, tokens: None,
                                                         ports: int) -> None:
    proc, root = serve_vllm(vllm_model, tmp_path, ports, "--max-loras", "3", "--max-lora-rank", "8")
    try:
        trainer = trainer_on(vllm_model, tmp_path / "run", root, ports)
        with trainer:
            before = {name: greedy(root, name) for name in NAMES}
            row = trainer.train()[-1]
            embedded = trainer.server.embedded
            after = {name: greedy(root, name) for name in NAMES}
            own = {name: greedy(embedded.base_url, name, trainer._services.api_key) for name in NAMES}
            health = httpx.get(f"{root}/health", timeout=30).json()
    finally:
        proc.terminate()
        proc.wait(60)
    assert row["rollouts_ok"] == 4 and health["adapters"] == embedded_versions(row)
    worst = 0.0
    for name in NAMES:  # vLLM's LoRA layers with the pushed adapter = the Trainer's server with its adapter
        assert after[name][0] == own[name][0], name
        worst = max(worst, *(abs(a - b) for a, b in zip(after[name][1], own[name][1])))
    print(f"largest log-prob difference vLLM (pushed adapters) vs transformers: {worst:.2e}")
    assert worst <= LOGPROB_TOLERANCE
    assert any(abs(a - b) > 1e-3 for a, b in zip(after["writer"][1], before["writer"][1]))  # the push took effect


def embedded_versions(row: dict) -> dict[str, int]:
    return {name: row[f"agents/{name}/policy_version"] for name in NAMES}


def test_a_remote_vllm_server_without_lora_slots_is_refused_with_the_flags_to_add(vllm_model: Path, tmp_path: Path,
                                                                                  tokens: None, ports: int) -> None:
    proc, root = serve_vllm(vllm_model, tmp_path, ports)
    try:
        with pytest.raises(ServingError, match="--max-loras N --max-lora-rank R"):
            with trainer_on(vllm_model, tmp_path / "run", root, ports):
                pass
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_remote_vllm_server_serves_the_algorithms_one_lora_under_the_models_name(vllm_model: Path, tmp_path: Path,
                                                                                   tokens: None, ports: int) -> None:
    proc, root = serve_vllm(vllm_model, tmp_path, ports, "--max-loras", "1", "--max-lora-rank", "8")
    try:
        with lora_trainer(vllm_model, tmp_path / "run", root, ports, steps=1) as trainer:
            before = greedy(root, "policy")
            row = trainer.train()[-1]
            after = greedy(root, "policy")
            own = greedy(trainer.server.embedded.base_url, "policy", trainer._services.api_key)
            health = httpx.get(f"{root}/health", timeout=30).json()
        pushed = sorted(p.name for p in (tmp_path / "run" / "served-weights").rglob("*"))
    finally:
        proc.terminate()
        proc.wait(60)
    assert row["rollouts_ok"] == 4 and health["policy_version"] == row["policy_version"] == 1
    assert "adapters" not in health  # the adapter is the model's own, not a named one
    assert pushed == ["adapter_config.json", "adapter_model.safetensors", "lora", "v1"]  # no base weights travelled
    worst = max(abs(a - b) for a, b in zip(after[1], own[1]))
    print(f"largest log-prob difference vLLM (base + pushed LoRA) vs transformers (merged): {worst:.2e}")
    assert after[0] == own[0] and worst <= LOGPROB_TOLERANCE
    assert any(abs(a - b) > 1e-3 for a, b in zip(after[1], before[1]))  # the push took effect


def test_whole_weights_in_the_body_load_in_place_on_a_remote_vllm_server(vllm_model: Path, tmp_path: Path,
                                                                         ports: int) -> None:
    from safetensors.torch import save
    from test_weight_push import other_weights, server

    from spanrl.serving.client import PolicyClient

    weights = other_weights(vllm_model)
    proc, root = serve_vllm(vllm_model, tmp_path, ports)
    reference = server(vllm_model)
    try:
        before = greedy(root, "policy")
        version = PolicyClient(root, token=ADMIN).push(save(weights))
        reference.reload(weights)
        after, expected = greedy(root, "policy"), greedy(reference.base_url, "policy")
    finally:
        reference.shutdown()
        proc.terminate()
        proc.wait(60)
    worst = max(abs(a - b) for a, b in zip(after[1], expected[1]))
    print(f"largest log-prob difference vLLM (weights sent in the body) vs transformers: {worst:.2e}")
    assert version == 1 and after[0] == expected[0] and worst <= LOGPROB_TOLERANCE
    assert after[0] != before[0] or any(abs(a - b) > 1e-3 for a, b in zip(after[1], before[1]))
