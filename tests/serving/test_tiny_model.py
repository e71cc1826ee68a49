"""The local tiny model and tokenizer builder (spanrl.demo.tiny)."""

from __future__ import annotations

import pathlib

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from spanrl.demo.tiny import build_tiny_model, build_tiny_tokenizer
from spanrl.errors import ConfigError

WORDS = [str(i) for i in range(100)] + ["add", "sub", "what", "is", "?"]

TOOL_ROUND_TRIP = [
    {"role": "system", "content": "add"},
    {"role": "user", "content": "what is 3 add 4 ?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "7"},
]


def test_tokenizer_roundtrips_words_and_joins_with_spaces() -> None:
    tok = build_tiny_tokenizer(WORDS)
    ids = tok("what is 12 add 30 ?")["input_ids"]
    assert len(ids) == 6 and tok.unk_token_id not in ids
    assert tok.decode(ids) == "what is 12 add 30 ?"
    assert tok("banana")["input_ids"] == [tok.unk_token_id]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)


def test_chat_template_renders_tool_calls_and_results_as_words() -> None:
    tok = build_tiny_tokenizer(WORDS)
    text = tok.apply_chat_template(TOOL_ROUND_TRIP, tokenize=False, add_generation_prompt=True)
    assert text.split() == (
        "<bos> <system> add <eos> <user> what is 3 add 4 ? <eos> "
        "<assistant> <call> add 3 4 </call> <eos> <tool> 7 <eos> <assistant>"
    ).split()
    ids = tok(text)["input_ids"]
    assert tok.unk_token_id not in ids
    # arguments as an OpenAI-style JSON string are written as-is
    as_string = [dict(TOOL_ROUND_TRIP[2], tool_calls=[{"function": {"name": "add", "arguments": "3 4"}}])]
    assert "<call> add 3 4 </call>" in " ".join(tok.apply_chat_template(as_string, tokenize=False).split())


def test_build_tiny_model_saves_a_loadable_folder_deterministically(tmp_path: pathlib.Path) -> None:
    a = build_tiny_model(tmp_path / "a", words=WORDS, seed=3)
    b = build_tiny_model(tmp_path / "b", words=WORDS, seed=3)
    model = AutoModelForCausalLM.from_pretrained(a)
    other = AutoModelForCausalLM.from_pretrained(b)
    tok = AutoTokenizer.from_pretrained(a)
    n_params = sum(p.numel() for p in model.parameters())
    assert 600_000 < n_params < 700_000
    assert model.config.tie_word_embeddings and model.config.vocab_size == len(tok)
    for (name, p), q in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(p, q), name
    text = tok.apply_chat_template(TOOL_ROUND_TRIP, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<bos> <system>") and tok.decode(tok(text)["input_ids"]) == " ".join(text.split())
    ids = tok(text)["input_ids"]
    out = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False)
    expected = list(ids)  # greedy by hand: the argmax of each next-token distribution, stopping at <eos>
    with torch.no_grad():
        for _ in range(3):
            expected.append(int(model(torch.tensor([expected])).logits[0, -1].argmax()))
            if expected[-1] == tok.eos_token_id:
                break
    assert out[0].tolist() == expected


def test_build_tiny_rejects_bad_words_and_shapes(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="words: .*'two words'"):
        build_tiny_tokenizer(["ok", "two words"])
    with pytest.raises(ConfigError, match=r"hidden_size \(130\) must be divisible by num_heads \(4\)"):
        build_tiny_model(tmp_path, words=WORDS, hidden_size=130)
    with pytest.raises(ConfigError, match="num_layers must be a positive integer, got 0"):
        build_tiny_model(tmp_path, words=WORDS, num_layers=0)
