"""The tokenizer and chat template of a GGUF file, and the Ollama ``Modelfile`` beside it.

GGUF keeps no ``tokenizer.json``: it stores the vocabulary, merges, token types and special ids under
llama.cpp's ``tokenizer.ggml.*`` keys, and readers (llama.cpp, Ollama, transformers' GGUF loader) rebuild
the tokenizer from a named model (``gpt2`` = byte-level BPE) and pre-tokenizer (``gpt2``, ``smollm``, ...).
Only a byte-level BPE tokenizer whose pre-tokenizer has a llama.cpp name is written; any other shape
(the tiny model's word-level tokenizer, a sentencepiece vocabulary) is refused with the reason, since a
reader would rebuild a different tokenizer from it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from spanrl.errors import ConfigError

__all__ = ["GGUFVocab", "gguf_vocab", "ollama_modelfile"]

# llama.cpp's token types (gguf.TokenType): NORMAL, CONTROL (special), USER_DEFINED (added, not special), UNUSED.
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 6

_CHATML_PROBE = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
_CHATML_RENDERED = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"

# Ollama templates are Go templates, not Jinja: this is ChatML in Ollama's shape (its own smollm2 Modelfile).
_CHATML_GO_TEMPLATE = """{{- if .Messages }}
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 -}}
<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ if $last }}<|im_start|>assistant
{{ end }}
{{- end }}
{{- else }}
{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{ if .Prompt }}<|im_start|>user
{{ .Prompt }}<|im_end|>
{{ end }}<|im_start|>assistant
{{ end }}{{ .Response }}{{ if .Response }}<|im_end|>{{ end }}"""


@dataclasses.dataclass
class GGUFVocab:
    """What the ``tokenizer.*`` keys of a GGUF file hold."""

    pre: str
    """llama.cpp's name of the pre-tokenizer (``tokenizer.ggml.pre``)."""
    tokens: list[str]
    """Token strings by id, in the byte-level spelling (``Ġthe``), padded to the embedding's rows."""
    token_types: list[int]
    """llama.cpp token type of each token."""
    merges: list[str]
    """BPE merges, ``"a b"`` each, best first."""
    special_ids: dict[str, int]
    """``bos``, ``eos``, ``unk``, ``pad`` -> id, those the tokenizer has."""
    add_bos: bool
    """Whether encoding text adds the BOS token."""
    add_eos: bool
    """Whether encoding text adds the EOS token."""
    chat_template: str | None
    """The Jinja chat template, or None."""


def _pre_tokenizer_name(pre: dict[str, Any] | None) -> str | None:
    """llama.cpp's name for a tokenizers pre-tokenizer, or None when it has none."""
    if pre is None:
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt2"  # the GPT-2 split regex, then bytes
    if pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers") or []
        if (
            len(parts) == 2
            and parts[0].get("type") == "Digits"
            and parts[0].get("individual_digits")
            and parts[1].get("type") == "ByteLevel"
            and parts[1].get("use_regex", True)
        ):
            return "smollm"  # SmolLM's hub tokenizer: single digits, then GPT-2 byte level
    return None


def _merges(model: dict[str, Any]) -> list[str]:
    merges = model.get("merges") or []
    return [" ".join(m) if isinstance(m, (list, tuple)) else str(m) for m in merges]


def _adds(tokenizer: Any) -> tuple[bool, bool]:
    """Whether plain encoding puts BOS first and EOS last (read from the tokenizer, not guessed)."""
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    plain = tokenizer.encode("a b", add_special_tokens=False)
    full = tokenizer.encode("a b")
    more = len(full) > len(plain)
    add_bos = more and bos is not None and full[0] == bos and full[1 : 1 + len(plain)] == plain
    add_eos = more and eos is not None and full[-1] == eos and full[-1 - len(plain) : -1] == plain
    return bool(add_bos), bool(add_eos)


def gguf_vocab(tokenizer: Any, *, rows: int) -> GGUFVocab:
    """The GGUF form of a Hugging Face fast tokenizer for a model whose embedding has ``rows`` rows.

    Raises :class:`ConfigError` naming why when GGUF readers could not rebuild this tokenizer.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError("tokenizer: GGUF export needs a fast (tokenizers) tokenizer; this checkpoint has a slow one")
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    kind = model.get("type")
    pre = _pre_tokenizer_name(spec.get("pre_tokenizer"))
    if kind != "BPE" or pre is None or spec.get("normalizer") is not None or model.get("byte_fallback"):
        raise ConfigError(
            "tokenizer: GGUF can hold a byte-level BPE tokenizer (tokenizer.ggml.model 'gpt2', pre-tokenizer "
            f"ByteLevel or SmolLM's Digits+ByteLevel); this checkpoint's is a {kind} model with pre-tokenizer "
            f"{(spec.get('pre_tokenizer') or {}).get('type')!r} and normalizer "
            f"{(spec.get('normalizer') or {}).get('type')!r}, which llama.cpp and transformers' GGUF loader "
            "cannot rebuild (the tiny word-level model has no GGUF form)"
        )
    vocab = tokenizer.get_vocab()
    if len(vocab) > rows:
        raise ConfigError(f"tokenizer: {len(vocab)} tokens but the model's embedding has only {rows} rows")
    by_id: dict[int, str] = {index: token for token, index in vocab.items()}
    added = {t["id"]: bool(t.get("special")) for t in spec.get("added_tokens") or []}
    tokens: list[str] = []
    types: list[int] = []
    for index in range(rows):
        if index not in by_id:  # rows past the vocabulary, as llama.cpp's convert pads them
            tokens.append(f"[PAD{index}]")
            types.append(_UNUSED)
        else:
            tokens.append(by_id[index])
            types.append(_NORMAL if index not in added else (_CONTROL if added[index] else _USER_DEFINED))
    special = {
        name: token_id
        for name, token_id in (
            ("bos", tokenizer.bos_token_id),
            ("eos", tokenizer.eos_token_id),
            ("unk", tokenizer.unk_token_id),
            ("pad", tokenizer.pad_token_id),
        )
        if token_id is not None
    }
    add_bos, add_eos = _adds(tokenizer)
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return GGUFVocab(pre, tokens, types, _merges(model), special, add_bos, add_eos, template)


def _default_system(tokenizer: Any) -> str | None:
    """The system prompt the template adds when the conversation has none (SmolLM2 has one)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": "U"}], tokenize=False)
    head = "<|im_start|>system\n"
    if text.startswith(head):
        return text[len(head) : text.index("<|im_end|>")]
    return None


def ollama_modelfile(tokenizer: Any, gguf_name: str, *, stop: list[str]) -> str:
    """An Ollama ``Modelfile`` for ``gguf_name`` (beside it): ChatML template, default system, stop tokens.

    Raises :class:`ConfigError` when the chat template is not ChatML: Ollama wants a Go template, and
    only ChatML's is known to render the same text as the Jinja one.
    """
    if not isinstance(tokenizer.chat_template, str):
        raise ConfigError("--ollama: the checkpoint's tokenizer has no chat template to write into the Modelfile")
    rendered = tokenizer.apply_chat_template(_CHATML_PROBE, tokenize=False, add_generation_prompt=True)
    if rendered != _CHATML_RENDERED:
        raise ConfigError(
            "--ollama: the chat template is not ChatML (<|im_start|>role ... <|im_end|>); Ollama needs a Go "
            f"template, written only for ChatML; this one renders {rendered[:80]!r}"
        )
    lines = [f"FROM ./{gguf_name}", f'TEMPLATE """{_CHATML_GO_TEMPLATE}"""']
    system = _default_system(tokenizer)
    if system:
        lines.append(f'SYSTEM """{system}"""')
    lines += [f"PARAMETER stop {json.dumps(token)}" for token in dict.fromkeys(["<|im_start|>", "<|im_end|>", *stop])]
    return "\n".join(lines) + "\n"
