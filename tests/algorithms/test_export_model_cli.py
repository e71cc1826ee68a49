"""``spanrl export model RUN_FOLDER``, as the README writes it: a run folder (which holds the Trainer's own
``config.json``) exports its newest complete checkpoint; a folder that is neither a run nor a model is one
line and exit code 2; no third-party progress bars or log lines on the terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _tiny_bpe_llama(folder: Path, *, seed: int) -> None:
    """A one-layer Llama with a byte-level BPE tokenizer (the tiny demo model's word-level one has no GGUF form)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(["what is 3 add 4", "the answer is 7"], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)


def _export(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "spanrl", "export", "model", str(source), "--outtype", "q8_0", "-o", str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Laid out as a Trainer leaves it: its config.json (no model_type), checkpoint-1 and checkpoint-2 complete,
    checkpoint-3 cut short (no trainer_state.json)."""
    from spanrl.algorithms.checkpoint_folders import write_trainer_state

    run = tmp_path_factory.mktemp("export") / "run"
    for step in (1, 2, 3):
        _tiny_bpe_llama(run / f"checkpoint-{step}", seed=step)
        if step < 3:
            write_trainer_state(run / f"checkpoint-{step}", step=step, history=[], config={})
    (run / "config.json").write_text(json.dumps({"output_dir": str(run), "model": "tiny", "max_steps": 3}))
    return run


def test_run_folder_exports_its_newest_complete_checkpoint(run_folder: Path, tmp_path: Path) -> None:
    import torch
    from gguf import GGUFReader, quants

    done = _export(run_folder, tmp_path / "policy.gguf")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "policy.gguf")
    # no "Loading weights" bar, no gguf writer lines: one line saying which checkpoint was written
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"(q8_0) from {run_folder / 'checkpoint-2'}"), done.stderr
    reader = GGUFReader(str(tmp_path / "policy.gguf"))
    name = bytes(reader.fields["general.name"].parts[-1]).decode()
    assert name == "checkpoint-2"
    # the embedding written is checkpoint-2's, not checkpoint-3's (incomplete) nor checkpoint-1's
    from transformers import AutoModelForCausalLM

    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    embedding = torch.as_tensor(quants.dequantize(tensor.data, tensor.tensor_type).copy())
    for step, same in ((2, True), (1, False), (3, False)):
        weights = AutoModelForCausalLM.from_pretrained(run_folder / f"checkpoint-{step}").model.embed_tokens.weight
        close = torch.allclose(embedding.reshape(weights.shape), weights.float(), atol=0.01)
        assert close is same, step


def test_neither_run_nor_model_is_one_line_and_exit_2(run_folder: Path, tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    done = _export(tmp_path / "notes", tmp_path / "x.gguf")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"spanrl: error: checkpoint: {str(tmp_path / 'notes')!r} is neither a run folder (output_dir with "
        "checkpoint-N/) nor a model folder (config.json with model_type, or a PEFT adapter_config.json): give one "
        "of those"]
    young = tmp_path / "young-run"  # a run that has saved no checkpoint yet
    young.mkdir()
    (young / "config.json").write_text(json.dumps({"output_dir": str(young)}))
    done = _export(young, tmp_path / "x.gguf")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "has no complete checkpoint-N/ yet" in done.stderr
    assert not (tmp_path / "x.gguf").exists()
