"""A lean forward pass for the Llama models the transformers backend serves: the same weights and math as
``transformers``' ``LlamaForCausalLM`` (RMSNorm, rotary embeddings, SDPA attention, SwiGLU MLP), without its
per-call layers (module dispatch, config look-ups, mask builders, output objects).

Why: on a small model a decode step is almost all of that overhead. The demo's tiny Llama took ~2.2 ms of CPU
per forward, of which its 29 matrix products are ~0.25 ms; the batcher thread running it was the largest part of
a GRPO step's CPU and held the GIL that the server, collector and runner threads of the same process share
(docs/measurements.md, "Where the demo's CPU goes"). On large models the matrix products dominate and this
changes little.

Used only where its math is the model's own (``supports``): a plain ``LlamaForCausalLM`` with SiLU, no biases,
default RoPE, SDPA attention, and no LoRA adapters (PEFT replaces the linear layers, which this reads directly);
and by the backend on CPU only (a GPU's SDPA kernels were not compared). Anything else keeps ``transformers``'
forward. Its KV cache (``LeanCache``) has the ``layers[i].keys / .values`` and
``batch_select_indices`` that the backend's continuous batching uses on transformers' ``DynamicCache``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["LeanCache", "LeanLlama", "supports"]


def supports(model: Any) -> bool:
    """Whether ``LeanLlama`` computes what ``model``'s own forward does."""
    config = getattr(model, "config", None)
    rope = getattr(config, "rope_parameters", None) or {}
    return (
        type(model).__name__ == "LlamaForCausalLM"
        and getattr(config, "hidden_act", None) == "silu"
        and not getattr(config, "attention_bias", True)
        and not getattr(config, "mlp_bias", True)
        and getattr(config, "pretraining_tp", 1) == 1
        and rope.get("rope_type", "default") == "default"
        and float(getattr(model.model.rotary_emb, "attention_scaling", 1.0)) == 1.0
        and getattr(config, "_attn_implementation", None) == "sdpa"  # eager attention rounds otherwise
    )


class _Layer:
    __slots__ = ("keys", "values")

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None  # (B, KV heads, L, D)
        self.values: torch.Tensor | None = None


class LeanCache:
    """Keys and values per layer, grown by each forward."""

    def __init__(self, layers: int) -> None:
        self.layers = [_Layer() for _ in range(layers)]

    def batch_select_indices(self, index: torch.Tensor) -> None:
        """Keep only the rows ``index`` (finished rows leave the batch)."""
        for layer in self.layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]


class LeanLlama:
    """``LlamaForCausalLM``'s forward for generation: the last position's logits, the cache grown in place."""

    def __init__(self, model: Any) -> None:
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.scaling = self.head_dim**-0.5
        body = model.model
        # The parameters themselves, read once (nn.Module attribute look-ups were a tenth of a step); a reload copies
        # new weights into them in place (TransformersBackend.load_weights), so they stay current.
        self.embed, self.norm, self.head = body.embed_tokens.weight, body.norm.weight, model.lm_head.weight
        self.inv_freq = body.rotary_emb.inv_freq
        self.layers = [
            (layer.input_layernorm.weight, layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight,
             layer.self_attn.v_proj.weight, layer.self_attn.o_proj.weight, layer.post_attention_layernorm.weight,
             layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight, layer.mlp.down_proj.weight)
            for layer in body.layers
        ]

    def new_cache(self) -> LeanCache:
        return LeanCache(len(self.layers))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """LlamaRMSNorm: in float32, then back to the input's dtype."""
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 cache: LeanCache) -> torch.Tensor:
        """``ids`` (B, T) appended after what ``cache`` holds; ``mask`` (B, past + T): 1 on real tokens, 0 on left
        padding; ``positions`` (B, T). Returns the logits of the last position, (B, V) in float32."""
        batch, width = ids.shape
        x = F.embedding(ids, self.embed)  # (B, T, H)
        freqs = positions[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos().to(x.dtype)[:, None], angles.sin().to(x.dtype)[:, None]  # (B, 1, T, D)
        allowed = _allowed(mask.bool(), width)  # (B, 1, T, past + T)
        half = self.head_dim // 2
        for (in_norm, wq, wk, wv, wo, post_norm, gate, up, down), kv in zip(self.layers, cache.layers):
            h = self._norm(x, in_norm)
            q = F.linear(h, wq).view(batch, width, self.heads, self.head_dim).transpose(1, 2)  # (B, heads, T, D)
            k = F.linear(h, wk).view(batch, width, self.kv_heads, self.head_dim).transpose(1, 2)
            v = F.linear(h, wv).view(batch, width, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            if kv.keys is None:
                kv.keys, kv.values = k, v
            else:
                kv.keys, kv.values = torch.cat([kv.keys, k], dim=-2), torch.cat([kv.values, v], dim=-2)
            keys, values = kv.keys, kv.values
            if self.kv_heads != self.heads:  # grouped-query attention: each kv head serves heads / kv_heads
                keys = keys.repeat_interleave(self.heads // self.kv_heads, dim=1)
                values = values.repeat_interleave(self.heads // self.kv_heads, dim=1)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, scale=self.scaling)
            x = x + F.linear(out.transpose(1, 2).reshape(batch, width, -1), wo)
            h = self._norm(x, post_norm)
            x = x + F.linear(F.silu(F.linear(h, gate)) * F.linear(h, up), down)
        return F.linear(self._norm(x[:, -1:, :], self.norm), self.head)[:, -1, :].float()


def _allowed(mask: torch.Tensor, width: int) -> torch.Tensor:
    """Which keys each of the ``width`` new positions attends to: real keys at or before it. A padding position
    (prefill's left padding) attends to itself only, so its (unused) output is finite, never NaN."""
    total = mask.shape[1]
    if width == 1:
        return mask[:, None, None, :]
    query_cols = torch.arange(total - width, total, device=mask.device)[:, None]  # (T, 1)
    key_cols = torch.arange(total, device=mask.device)[None, :]  # (1, past + T)
    causal = key_cols <= query_cols
    allowed = causal[None] & mask[:, None, :]
    allowed |= (key_cols == query_cols)[None] & ~mask[:, -width:, None]
    return allowed[:, None]
