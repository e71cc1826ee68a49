"""``spanrl export model --format gguf``: SmolLM2 written as GGUF and read back through transformers' GGUF
loader (the path ``spanrl serve --model FILE.gguf`` takes) gives the checkpoint's greedy tokens and
logits; a merged LoRA adapter exports merged; the Ollama Modelfile; the tiny word-level model refused."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch

from spanrl.errors import ConfigError
from spanrl.serving.gguf_export import GGUF_TYPES, export_gguf
from spanrl.serving.models import SMOLLM2, resolve_model

_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 12 plus 30?"}],
]
_NEW_TOKENS = 16

# q8_0, measured on 2026-12-01 (SmolLM2-135M-Instruct, both prompts, 16 greedy tokens): greedy tokens all
# equal; argmax agreement 32/32 on the reference sequences; max |logit difference| 1.49 over all positions,
# 1.02 over the new ones (logits span about -32..+41). For comparison f16: 0.041, bf16: 0.28, both 32/32.
# The bounds leave room for other torch builds, not for a broken file.
_Q8_MAX_LOGIT_DIFF = 3.0
_Q8_MIN_AGREEMENT = 0.9


def _load_gguf(path: pathlib.Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval(), tokenizer


def _greedy(model, ids: torch.Tensor) -> torch.Tensor:
    """``ids`` extended by ``_NEW_TOKENS`` argmax tokens (no stop token: every step is compared)."""
    with torch.no_grad():
        for _ in range(_NEW_TOKENS):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits[0]


@pytest.fixture(scope="module")
def smollm2() -> pathlib.Path:
    return resolve_model(SMOLLM2)


@pytest.fixture(scope="module")
def reference(smollm2: pathlib.Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(smollm2)


@pytest.fixture(scope="module")
def cli_q8(smollm2: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The q8_0 file and Modelfile that ``spanrl export model ... --ollama`` writes."""
    out = tmp_path_factory.mktemp("cli") / "smol-q8.gguf"
    cmd = [sys.executable, "-m", "spanrl", "export", "model", str(smollm2), "--format", "gguf",
           "--outtype", "q8_0", "-o", str(out), "--ollama"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    return out


def _prompt_ids(tokenizer, messages) -> torch.Tensor:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                         return_dict=True)["input_ids"]


@pytest.mark.slow
def test_smollm2_f32_round_trip_equal_tokens_and_logits(smollm2, reference, tmp_path) -> None:
    ref_model, ref_tokenizer = reference
    path = export_gguf(smollm2, tmp_path / "smol-f32.gguf", kind="f32")
    model, tokenizer = _load_gguf(path)
    assert tokenizer.chat_template == ref_tokenizer.chat_template
    for messages in _PROMPTS:
        ids = _prompt_ids(ref_tokenizer, messages)
        assert torch.equal(_prompt_ids(tokenizer, messages), ids)  # the tokenizer came through whole
        expected = _greedy(ref_model, ids)
        assert torch.equal(_greedy(model, ids), expected)
        assert (_logits(model, expected) - _logits(ref_model, expected)).abs().max().item() <= 1e-4
    text = "  Hello, world! 12345 <|im_end|> naïve\n\tcafé"
    assert tokenizer.encode(text) == ref_tokenizer.encode(text)


@pytest.mark.slow
def test_smollm2_q8_0_round_trip_close(reference, cli_q8) -> None:
    ref_model, ref_tokenizer = reference
    model, _ = _load_gguf(cli_q8)
    worst, agree, total = 0.0, 0, 0
    for messages in _PROMPTS:
        ids = _prompt_ids(ref_tokenizer, messages)
        expected = _greedy(ref_model, ids)
        got, want = _logits(model, expected), _logits(ref_model, expected)
        worst = max(worst, (got - want).abs().max().item())
        new = slice(ids.shape[1] - 1, -1)  # the positions that chose the new tokens
        agree += int((got[new].argmax(-1) == want[new].argmax(-1)).sum())
        total += _NEW_TOKENS
    assert 0 < worst <= _Q8_MAX_LOGIT_DIFF, worst  # 0 would mean nothing was quantized
    assert agree / total >= _Q8_MIN_AGREEMENT, (agree, total)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "rounding"), [("f16", 2.0**-11), ("bf16", 2.0**-8)])
def test_f16_and_bf16_tensors_round_to_nearest(smollm2, reference, tmp_path, kind, rounding) -> None:
    """Read back with gguf's own dequantizer (no transformers): each value within half a unit of its
    precision, norms exact, the embedding unpermuted, V unpermuted and Q permuted (llama.cpp's layout)."""
    from gguf import GGUFReader, dequantize

    state = reference[0].state_dict()
    reader = GGUFReader(str(export_gguf(smollm2, tmp_path / f"smol-{kind}.gguf", kind=kind)))
    read = {t.name: torch.from_numpy(dequantize(t.data, t.tensor_type).copy()) for t in reader.tensors}
    for gguf_name, hf_name in (("token_embd.weight", "model.embed_tokens.weight"),
                               ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"),
                               ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight")):
        want = state[hf_name]
        assert ((read[gguf_name] - want).abs() <= want.abs() * rounding + 1e-30).all(), gguf_name
    assert torch.equal(read["blk.3.attn_norm.weight"], state["model.layers.3.input_layernorm.weight"])
    q = state["model.layers.3.self_attn.q_proj.weight"]
    assert not torch.allclose(read["blk.3.attn_q.weight"], q, atol=1e-2)  # rows interleaved, as readers expect


@pytest.mark.slow
def test_cli_writes_q8_0_file_and_ollama_modelfile(cli_q8) -> None:
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(str(cli_q8))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == GGMLQuantizationType.F32  # norms stay f32
    assert "output.weight" not in types  # tied embeddings: readers tie them back
    assert reader.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert "<|im_start|>" in reader.fields["tokenizer.chat_template"].contents()
    modelfile = (cli_q8.parent / "Modelfile").read_text().splitlines()
    assert modelfile[0] == "FROM ./smol-q8.gguf"
    assert modelfile[1].startswith('TEMPLATE """{{- if .Messages }}')
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and 'PARAMETER stop "<|im_start|>"' in modelfile
    assert any(line.startswith('SYSTEM """You are a helpful AI assistant named SmolLM') for line in modelfile)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_spanrl_serve_answers_from_exported_gguf(cli_q8, tmp_path) -> None:
    port = _free_port()
    log_path = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "spanrl", "serve", "--model", str(cli_q8), "--port", str(port),
           "--otlp-endpoint", "none", "--threads", "2"]
    env = dict(os.environ, SPANRL_CACHE_DIR=str(tmp_path / "cache"))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 300
            while True:
                assert proc.poll() is None, log_path.read_text()
                try:
                    name = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["model"]
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, "spanrl serve did not become ready"
                    time.sleep(0.5)
            reply = httpx.post(
                f"http://127.0.0.1:{port}/rollouts/r-gguf/v1/chat/completions",
                json={"model": name, "max_tokens": 8, "temperature": 0,
                      "messages": [{"role": "user", "content": "What is the capital of France? One word."}]},
                timeout=120,
            )
        finally:
            proc.terminate()
            code = proc.wait(60)
    assert reply.status_code == 200, reply.text
    assert "paris" in reply.json()["choices"][0]["message"]["content"].lower(), reply.json()
    assert code == 0, log_path.read_text()


def _export_cli(source: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    cmd = [sys.executable, "-m", "spanrl", "export", "model", str(source), "--outtype", "f32", "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.slow
def test_lora_run_exports_merged(smollm2, tmp_path) -> None:
    """A small untied Llama with SmolLM2's tokenizer and a LoRA adapter with non-zero weights, laid out
    as a Trainer run (``checkpoint-N/``: merged weights, ``adapters/default/``, trainer state): the adapter
    folder and the run folder both export the merged weights (and ``output.weight``, the untied head)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from spanrl.algorithms.checkpoint_folders import write_trainer_state

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=256)
    run = tmp_path / "run"
    LlamaForCausalLM(config).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    base = LlamaForCausalLM.from_pretrained(tmp_path / "base").eval()  # loaded: the adapter names its folder
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                 target_modules="all-linear"))
    # as algorithms/base.py saves it; adapter_config.json names tmp_path / "base"
    peft_model.save_pretrained(run / "checkpoint-2" / "adapters" / "default")
    ids = tokenizer.encode("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        merged_model = peft_model.merge_and_unload().eval()
        merged = merged_model(ids).logits[0]
        unmerged = LlamaForCausalLM.from_pretrained(tmp_path / "base").eval()(ids).logits[0]
    for step, model in ((1, LlamaForCausalLM.from_pretrained(tmp_path / "base")), (2, merged_model)):
        model.save_pretrained(run / f"checkpoint-{step}")
        tokenizer.save_pretrained(run / f"checkpoint-{step}")
        write_trainer_state(run / f"checkpoint-{step}", step=step, history=[], config={})
    for source in (run / "checkpoint-2" / "adapters" / "default", run):
        model, _ = _load_gguf(_export_cli(source, tmp_path / source.name / "out.gguf"))
        got = _logits(model, ids)
        assert (got - merged).abs().max().item() <= 1e-4, source
        assert (got - unmerged).abs().max().item() > 1e-2  # the adapter changed the weights


def test_tiny_word_level_model_refused_before_writing(tiny_model_dir, tmp_path) -> None:
    out = tmp_path / "tiny.gguf"
    with pytest.raises(ConfigError, match=r"WordLevel model .*cannot rebuild \(the tiny word-level model"):
        export_gguf(tiny_model_dir, out, kind="f32", ollama=True)
    assert list(tmp_path.iterdir()) == []  # neither file nor temporary nor Modelfile


def test_cli_refuses_bad_type_and_name(tiny_model_dir, tmp_path) -> None:
    from spanrl.serving._cli import _GGUF_TYPES

    assert _GGUF_TYPES == GGUF_TYPES  # the CLI's copy (kept to import nothing at startup) is the writer's
    with pytest.raises(ConfigError, match="GGUF type must be one of f32, f16, bf16, q8_0, got 'q4_k'"):
        export_gguf(tiny_model_dir, tmp_path / "x.gguf", kind="q4_k")
    with pytest.raises(ConfigError, match="must end in .gguf"):
        export_gguf(tiny_model_dir, tmp_path / "x.bin", kind="f32")
    cmd = [sys.executable, "-m", "spanrl", "export", "model", str(tiny_model_dir), "-o", str(tmp_path / "t.gguf")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    # a model the writer cannot convert is bad input (ConfigError): one error line, the usage exit status
    assert done.returncode == 2 and "spanrl: error:" in done.stderr and "WordLevel" in done.stderr
    assert "Traceback" not in done.stderr
