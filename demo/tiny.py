"""A tiny causal LM and word-level tokenizer, built locally (no model hub), for tests and demos.

The tokenizer has one token per word (split on whitespace; unknown words become ``<unk>``) and decodes
by joining words with single spaces. Its chat template renders every message as words::

    <bos> <system> be brief <eos> <user> 3 add 4 <eos> <assistant> <call> add 3 4 </call> <eos>
    <tool> 7 <eos> <assistant> 7 <eos>

- roles: ``system``, ``user``, ``assistant``, ``tool`` each open with their marker word and end with
  ``<eos>``; ``add_generation_prompt`` appends ``<assistant>``, so generation stops on ``<eos>``.
- assistant tool calls are rendered as ``<call> NAME V1 V2 ... </call>`` (argument *values* in the
  order given; ``arguments`` may be a mapping or a JSON string, which is written as-is). The policy server
  parses the same shape back into OpenAI ``tool_calls`` (see ``spanrl.serving``).
- a tool result is a ``tool`` message: ``<tool> CONTENT <eos>``.

The model is a ``LlamaForCausalLM`` (default hidden 128, 4 layers, 4 heads, FFN 256, tied embeddings:
~667k parameters with a few hundred words), saved with its tokenizer as a Hugging Face folder that
``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` load offline.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from spanrl.errors import ConfigError, positive_int

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "CALL_CLOSE",
    "CALL_OPEN",
    "ROLE_WORDS",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "build_tiny_tokenizer",
]

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
"""Special tokens, ids 0..3 in this order (skipped by ``decode(..., skip_special_tokens=True)``)."""

ROLE_WORDS: dict[str, str] = {"system": "<system>", "user": "<user>", "assistant": "<assistant>", "tool": "<tool>"}
"""Word that opens a message of each role (ordinary tokens, kept by decode)."""

CALL_OPEN, CALL_CLOSE = "<call>", "</call>"
"""Words around a rendered tool call: ``<call> NAME V1 V2 </call>``."""

_DEFAULT_MAX_POSITIONS = 1024

# Every piece ends with a space, so whitespace splitting always separates the words.
_CHAT_TEMPLATE = (
    "{{- '<bos> ' -}}"
    "{%- for message in messages -%}"
    "{%- set role = message['role'] -%}"
    "{%- if role not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('unknown role: ' ~ role) -}}"
    "{%- endif -%}"
    "{{- '<' ~ role ~ '> ' -}}"
    "{%- if message['content'] is string and message['content'] -%}"
    "{{- message['content'] ~ ' ' -}}"
    "{%- elif message['content'] is iterable and message['content'] is not string -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] ~ ' ' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- if role == 'assistant' and message.get('tool_calls') -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set fn = call['function'] if call.get('function') else call -%}"
    "{{- '<call> ' ~ fn['name'] ~ ' ' -}}"
    "{%- if fn['arguments'] is mapping -%}"
    "{%- for value in fn['arguments'].values() -%}{{- value ~ ' ' -}}{%- endfor -%}"
    "{%- elif fn['arguments'] -%}"
    "{{- fn['arguments'] ~ ' ' -}}"
    "{%- endif -%}"
    "{{- '</call> ' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<eos> ' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<assistant> ' -}}{%- endif -%}"
)


def build_tiny_tokenizer(words: Iterable[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``words`` plus the special, role and tool-call words.

    Ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3, then role and call words, then ``words`` in
    the order given (duplicates dropped). A word must be non-empty and contain no whitespace.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for word in (*SPECIAL_TOKENS, *ROLE_WORDS.values(), CALL_OPEN, CALL_CLOSE, *words):
        if not isinstance(word, str) or not word or any(ch.isspace() for ch in word):
            raise ConfigError(f"words: each word must be a non-empty string without whitespace, got {word!r}")
        vocab.setdefault(word, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece with an impossible prefix joins tokens with single spaces.
    core.decoder = decoders.WordPiece(prefix="\x00##", cleanup=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,
        model_max_length=_DEFAULT_MAX_POSITIONS,
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    out_dir: str | pathlib.Path,
    *,
    words: Iterable[str],
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 256,
    seed: int = 0,
    max_position_embeddings: int = _DEFAULT_MAX_POSITIONS,
) -> pathlib.Path:
    """Build a randomly initialised Llama causal LM with its tiny tokenizer and save both to ``out_dir``.

    The same arguments and ``seed`` give the same weights. Returns ``out_dir`` as a ``Path``: a Hugging
    Face folder (config, safetensors weights, generation config, tokenizer with chat template).
    """
    for name, value in (
        ("hidden_size", hidden_size),
        ("num_layers", num_layers),
        ("num_heads", num_heads),
        ("intermediate_size", intermediate_size),
        ("max_position_embeddings", max_position_embeddings),
    ):
        positive_int(name, value)
    if hidden_size % num_heads:
        raise ConfigError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer(words)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
