"""Write a Llama-family Hugging Face checkpoint as one GGUF file for llama.cpp and Ollama.

Written with the ``gguf`` package (no llama.cpp build), in the layout llama.cpp's
``convert_hf_to_gguf.py`` writes for ``LlamaForCausalLM``:

- tensor names from ``gguf.get_tensor_name_map`` (``blk.N.attn_q.weight``...); ``output.weight`` only
  when the embeddings are untied (readers tie them when it is absent);
- Q and K rows permuted from Hugging Face's rotary layout (halves) to llama.cpp's (interleaved pairs),
  which readers, transformers' GGUF loader included, reverse;
- ``llama.*`` hyperparameters, the tokenizer and chat template (:mod:`spanrl.serving.gguf_vocab`);
- 1-D tensors (norms) stay f32 whatever the type, and a q8_0 tensor whose rows are not a multiple of
  32 falls back to f16, as llama.cpp does.

A PEFT adapter folder (``adapter_config.json``) is merged into its base model first; a Trainer
checkpoint already holds merged weights (``algorithms/base.py``).
"""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile
from typing import Any

from spanrl.errors import ConfigError

__all__ = ["GGUF_TYPES", "export_gguf"]

_logger = logging.getLogger(__name__)

GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")
"""Tensor types ``export_gguf`` writes."""

_Q8_BLOCK = 32  # values per q8_0 block: a row must be a multiple of this
_SKIPPED = ("rotary_emb.inv_freq",)  # buffers some checkpoints carry; readers recompute them


def _load(checkpoint: pathlib.Path) -> tuple[Any, Any]:
    """The float32 model and tokenizer of a HF folder, or of a PEFT adapter merged into its base."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (checkpoint / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        return model.eval(), AutoTokenizer.from_pretrained(checkpoint)
    if not (checkpoint / "adapter_config.json").is_file():
        raise ConfigError(
            f"checkpoint: {str(checkpoint)!r} is neither a Hugging Face model folder (config.json) nor a "
            "PEFT adapter folder (adapter_config.json)"
        )
    from peft import AutoPeftModelForCausalLM, PeftConfig

    base = PeftConfig.from_pretrained(checkpoint).base_model_name_or_path
    if not base or not (pathlib.Path(base) / "config.json").is_file():
        raise ConfigError(
            f"checkpoint: the adapter in {str(checkpoint)!r} names base model {base!r}, not a local model folder"
        )
    model = AutoPeftModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).merge_and_unload()
    has_tokenizer = (checkpoint / "tokenizer.json").is_file() or (checkpoint / "tokenizer_config.json").is_file()
    return model.eval(), AutoTokenizer.from_pretrained(checkpoint if has_tokenizer else base)


def _check_architecture(config: Any) -> None:
    """Refuse what the llama layout written here cannot express, naming the field."""
    if config.model_type != "llama":
        raise ConfigError(
            f"checkpoint: GGUF export writes Llama-family models (model_type 'llama'), got {config.model_type!r}"
        )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"checkpoint: rope scaling {rope.get('rope_type')!r} is not written to GGUF; only 'default'")
    for field in ("attention_bias", "mlp_bias"):
        if getattr(config, field, False):
            raise ConfigError(f"checkpoint: {field}=True is not written to GGUF (llama.cpp's llama has no biases)")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ConfigError(f"checkpoint: hidden_act must be 'silu' for GGUF's llama, got {config.hidden_act!r}")


def _rope_theta(config: Any) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _permute(weights: Any, n_head: int) -> Any:
    """llama.cpp's Q/K permutation (``LlamaModel.permute``): each head's two rotary halves interleaved."""
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape
    )


def _encode(array: Any, kind: str) -> tuple[Any, Any]:
    """``(data, raw type)`` of one tensor in ``kind`` (see module docstring for the f32 and f16 falls)."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    if array.ndim == 1 or kind == "f32":
        return array.astype(np.float32), GGMLQuantizationType.F32
    if kind == "q8_0" and array.shape[-1] % _Q8_BLOCK == 0:
        return quants.quantize(array, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0
    if kind == "bf16":
        return quants.quantize(array, GGMLQuantizationType.BF16), GGMLQuantizationType.BF16
    return array.astype(np.float16), GGMLQuantizationType.F16


def _tensors(model: Any) -> list[tuple[str, Any]]:
    """``(GGUF name, float32 array)`` for every weight, Q and K permuted; untied ``lm_head`` only."""
    import gguf
    import torch

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    out: list[tuple[str, Any]] = []
    for hf_name, tensor in model.state_dict().items():
        if hf_name.endswith(_SKIPPED) or (tied and hf_name == "lm_head.weight"):
            continue
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(base)
        if gguf_name is None or suffix != "weight":
            raise ConfigError(f"checkpoint: tensor {hf_name!r} has no name in GGUF's llama layout")
        array = tensor.detach().to(dtype=torch.float32).cpu().numpy()
        if gguf_name.endswith(".attn_q"):
            array = _permute(array, config.num_attention_heads)
        elif gguf_name.endswith(".attn_k"):
            array = _permute(array, config.num_key_value_heads or config.num_attention_heads)
        out.append((f"{gguf_name}.weight", array))
    return out


def _file_type(kind: str) -> int:
    from gguf import LlamaFileType

    return {
        "f32": LlamaFileType.ALL_F32,
        "f16": LlamaFileType.MOSTLY_F16,
        "bf16": LlamaFileType.MOSTLY_BF16,
        "q8_0": LlamaFileType.MOSTLY_Q8_0,
    }[kind]


def _add_hyperparameters(writer: Any, config: Any, *, name: str, kind: str) -> None:
    import gguf

    writer.add_name(name)
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(config.num_key_value_heads or config.num_attention_heads))
    writer.add_rope_dimension_count(_head_dim(config))
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_file_type(_file_type(kind))
    if kind == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _add_vocab(writer: Any, vocab: Any) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    adders = {
        "bos": writer.add_bos_token_id,
        "eos": writer.add_eos_token_id,
        "unk": writer.add_unk_token_id,
        "pad": writer.add_pad_token_id,
    }
    for key, token_id in vocab.special_ids.items():
        adders[key](int(token_id))
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)


def _stop_tokens(model: Any, tokenizer: Any) -> list[str]:
    """The tokens generation stops on: the tokenizer's EOS and the generation config's."""
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
    if tokenizer.eos_token_id is not None:
        ids.insert(0, tokenizer.eos_token_id)
    return list(dict.fromkeys(tokenizer.convert_ids_to_tokens(i) for i in ids))


def export_gguf(
    checkpoint: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    kind: str = "f16",
    ollama: bool = False,
) -> pathlib.Path:
    """Write ``checkpoint`` (HF folder or PEFT adapter folder) as the GGUF file ``output``; return its path.

    ``kind`` is one of :data:`GGUF_TYPES`. With ``ollama`` a ``Modelfile`` is written beside it. The file
    appears whole or not at all (written under a temporary name, then renamed).
    """
    from gguf import GGUFWriter

    from spanrl.serving.gguf_vocab import gguf_vocab, ollama_modelfile

    if kind not in GGUF_TYPES:
        raise ConfigError(f"format: GGUF type must be one of {', '.join(GGUF_TYPES)}, got {kind!r}")
    source, out = pathlib.Path(checkpoint), pathlib.Path(output)
    if out.suffix != ".gguf":
        raise ConfigError(f"output: a GGUF file name must end in .gguf, got {str(out)!r}")
    model, tokenizer = _load(source)
    _check_architecture(model.config)
    vocab = gguf_vocab(tokenizer, rows=int(model.get_input_embeddings().weight.shape[0]))
    # Checked before anything is written: a refused template leaves no half-export behind.
    modelfile = ollama_modelfile(tokenizer, out.name, stop=_stop_tokens(model, tokenizer)) if ollama else None
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        writer = GGUFWriter(tmp_name, "llama")
        _add_hyperparameters(writer, model.config, name=source.resolve().name, kind=kind)
        _add_vocab(writer, vocab)
        for name, array in _tensors(model):
            data, raw = _encode(array, kind)
            writer.add_tensor(name, data, raw_dtype=raw)  # quantized bytes: the writer derives the shape
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, out)
    except BaseException:
        pathlib.Path(tmp_name).unlink(missing_ok=True)
        raise
    if modelfile is not None:
        (out.parent / "Modelfile").write_text(modelfile)
    _logger.info("wrote %s (%s) from %s", out, kind, source)
    return out
