"""One server, many LoRA adapters: a request's ``model`` names its adapter, each adapter reloads on its own.

Adapters here are PEFT folders with random (non-zero) LoRA weights, so each one changes the greedy tokens;
every comparison is against a server holding that adapter alone, or the plain base.
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import shutil
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from spanrl import semconv
from spanrl.errors import ConfigError
from spanrl.serving import PolicyServer, ServerConfig

_ADMIN = "lora-adm1n"
_PROMPTS = ["1 add 2", "what is 7 sub 3 ?", "the answer is", "9 add 9 add 9"]


def save_adapter(base_dir: pathlib.Path, out: pathlib.Path, *, seed: int, r: int = 4) -> pathlib.Path:
    """A PEFT LoRA adapter folder on ``base_dir`` with random A and B (PEFT's default B=0 would change nothing)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: pathlib.Path) -> dict[str, pathlib.Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {"writer": save_adapter(tiny_model_dir, root / "writer", seed=1),
            "checker": save_adapter(tiny_model_dir, root / "checker", seed=2),
            "wide": save_adapter(tiny_model_dir, root / "wide", seed=3, r=8)}


def _server(model: pathlib.Path, modules: dict[str, pathlib.Path], **fields) -> PolicyServer:
    config = ServerConfig(model=model, port=0, otlp_endpoint=None, served_model_name="tiny", max_batch_delay_ms=30.0,
                          lora_modules={k: str(v) for k, v in modules.items()}, **fields)
    return PolicyServer(config, span_exporter=fields.pop("exporter", None))


@pytest.fixture(scope="module")
def both(tiny_model_dir, adapters, tmp_path_factory) -> Iterator[tuple[PolicyServer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    config = ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                          max_batch_delay_ms=30.0, admin_token=_ADMIN, checkpoint_root=adapters["writer"].parent,
                          lora_modules={"writer": str(adapters["writer"]), "checker": str(adapters["checker"])})
    with PolicyServer(config, span_exporter=exporter) as server:
        yield server, exporter


def _greedy(base_url: str, model: str, prompt: str) -> list[int]:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    reply = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model"] == model
    return reply.json()["choices"][0]["token_ids"]


def _alone(tiny_model_dir: pathlib.Path, modules: dict[str, pathlib.Path]) -> dict[tuple[str, str], list[int]]:
    """Greedy tokens of each prompt on a server holding only ``modules`` (empty: the plain base)."""
    with _server(tiny_model_dir, modules) as server:
        names = list(modules) or ["tiny"]
        return {(m, p): _greedy(server.base_url, m, p) for m in names for p in _PROMPTS}


def test_two_adapters_served_concurrently_match_each_adapter_alone(both, adapters, tiny_model_dir):
    server, _ = both
    jobs = [(m, p) for m in ("writer", "checker", "tiny") for p in _PROMPTS] * 2
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:  # all at once: the batcher must split them
        got = list(pool.map(lambda job: _greedy(server.base_url, *job), jobs))
    together = dict(zip(jobs, got))
    expected = {**_alone(tiny_model_dir, {"writer": adapters["writer"]}),
                **_alone(tiny_model_dir, {"checker": adapters["checker"]}), **_alone(tiny_model_dir, {})}
    assert together == expected
    for p in _PROMPTS:  # the adapters really differ, so a mixed-up forward pass would show
        assert len({tuple(expected[m, p]) for m in ("writer", "checker", "tiny")}) > 1
    assert any(expected["writer", p] != expected["checker", p] for p in _PROMPTS)


def test_models_lists_the_base_and_each_adapter(both):
    server, _ = both
    data = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()["data"]
    assert [m["id"] for m in data] == ["tiny", "writer", "checker"]
    assert [m.get("parent") for m in data] == [None, "tiny", "tiny"]
    unknown = httpx.post(f"{server.base_url}/v1/completions", json={"model": "nobody", "prompt": "1"}, timeout=30)
    assert unknown.status_code == 404
    assert "'writer'" in unknown.json()["error"]["message"]


def test_span_records_the_adapter_and_its_version(both):
    server, exporter = both
    exporter.clear()
    _greedy(server.base_url, "checker", "1 add 2")
    _greedy(server.base_url, "tiny", "1 add 2")
    server.force_flush()
    spans = exporter.get_finished_spans()
    by_model = {s.attributes[semconv.GEN_AI_REQUEST_MODEL]: s.attributes for s in spans}
    assert by_model["checker"][semconv.POLICY_ADAPTER] == "checker"
    assert by_model["checker"][semconv.POLICY_VERSION] == server.adapters["checker"]
    assert semconv.POLICY_ADAPTER not in by_model["tiny"]


def _reload(server: PolicyServer, path: pathlib.Path, model: str | None) -> httpx.Response:
    body = {"path": str(path), **({"model": model} if model else {})}
    return httpx.post(f"{server.base_url}/v1/weights/reload", json=body,
                      headers={"authorization": f"Bearer {_ADMIN}"}, timeout=120)


def test_reload_of_one_adapter_bumps_only_its_version(tiny_model_dir, adapters, tmp_path):
    # its own server: this test changes weights
    shutil.copytree(adapters["checker"], tmp_path / "checker-2")
    shutil.copytree(adapters["wide"], tmp_path / "wide")
    config = ServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                          admin_token=_ADMIN, checkpoint_root=tmp_path,
                          lora_modules={"writer": str(adapters["writer"]), "checker": str(adapters["checker"])})
    with PolicyServer(config) as server:
        before = {m: _greedy(server.base_url, m, p) for m in ("writer", "checker", "tiny") for p in _PROMPTS[:1]}
        reply = _reload(server, tmp_path / "checker-2", "writer")  # the writer now holds the checker's weights
        assert reply.status_code == 200, reply.text
        assert reply.json()["policy_version"] == 1
        assert server.adapters == {"writer": 1, "checker": 0} and server.version == 0
        assert _greedy(server.base_url, "writer", _PROMPTS[0]) == before["checker"]
        assert _greedy(server.base_url, "tiny", _PROMPTS[0]) == before["tiny"]

        refused = _reload(server, tmp_path / "wide", "writer")  # rank 8 into a rank-4 adapter: refused, kept
        assert refused.status_code == 400 and "rank" in refused.json()["error"]["message"]
        assert server.adapters["writer"] == 1
        assert _greedy(server.base_url, "writer", _PROMPTS[0]) == before["checker"]

        shutil.copytree(tiny_model_dir, tmp_path / "base-copy")  # a model folder is no adapter: refused, kept
        for name in ("writer", "fresh"):
            refused = _reload(server, tmp_path / "base-copy", name)
            assert refused.status_code == 400, refused.text
        assert server.adapters == {"writer": 1, "checker": 0}

        added = _reload(server, tmp_path / "wide", "wide")  # a new name: added at runtime, as vLLM's load_lora
        assert added.status_code == 200 and added.json()["policy_version"] == 0, added.text  # as if loaded at start
        assert server.adapters == {"writer": 1, "checker": 0, "wide": 0}


def test_base_reload_with_adapters_loaded(tiny_model_dir, tiny_model_dir_other, adapters):
    plain_other = _alone(tiny_model_dir_other, {})
    with _server(tiny_model_dir, {"writer": adapters["writer"]}) as server:
        writer_before = _greedy(server.base_url, "writer", _PROMPTS[0])
        assert server.reload(str(tiny_model_dir_other)) == 1
        assert server.adapters == {"writer": 0}
        assert {("tiny", p): _greedy(server.base_url, "tiny", p) for p in _PROMPTS} == plain_other
        assert _greedy(server.base_url, "writer", _PROMPTS[0]) != writer_before  # the adapter sits on the new base


def test_lora_modules_are_checked(tiny_model_dir, adapters, tmp_path):
    with pytest.raises(ConfigError, match="not a PEFT adapter folder"):
        ServerConfig(model=tiny_model_dir, lora_modules={"writer": str(tmp_path)}).validate()
    with pytest.raises(ConfigError, match="base model's name"):
        ServerConfig(model=tiny_model_dir, served_model_name="tiny",
                     lora_modules={"tiny": str(adapters["writer"])}).validate()


def test_batcher_groups_queued_requests_by_adapter(tiny_model_dir, adapters, caplog):
    from spanrl.serving.backend import GenerationRequest, SamplingParams
    from spanrl.serving.batcher import Batcher
    from spanrl.serving.hf_backend import TransformersBackend

    backend = TransformersBackend(tiny_model_dir, adapters={"writer": adapters["writer"],
                                                            "checker": adapters["checker"]})
    batcher = Batcher(backend, max_batch_size=8, max_batch_delay_ms=0)
    params = SamplingParams(max_tokens=4, temperature=0)
    ids = backend.tokenizer("1 add 2")["input_ids"]
    order = ["writer", "checker", None, "writer", "checker", None, "writer", "checker"]
    futures = [batcher.submit(GenerationRequest(list(ids), params, adapter=a)) for a in order]  # queued, then run
    batcher.start()
    try:
        results = [f.result(timeout=120) for f in futures]
    finally:
        batcher.shutdown()
    assert [r.adapter for r in results] == order
    # interleaved in the queue, generated as one batch per adapter (a mixed batch would fail and run one by one)
    assert [r.batch_size for r in results] == [3, 3, 2, 3, 3, 2, 3, 3]
    assert "a batch failed" not in caplog.text


def test_serve_cli_refuses_a_lora_module_without_a_path(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "spanrl", "serve", "--model", str(tiny_model_dir), "--port", "0",
                          "--otlp-endpoint", "none", "--lora-modules", f"writer={tmp_path}", "checker"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--lora-modules takes NAME=PATH pairs" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
