"""How an update cuts its batch into micro-batches, what the CPU can do (bf16), where the LM head runs,
and the rows' shared prompt prefix run once, for the policy-gradient algorithms.

Padding is compute thrown away: a micro-batch is padded to its longest row, so rows of similar length
belong together. ``length_sorted_micro_batches`` sorts a mini-batch's rows by (prompt, completion)
length before cutting it into micro-batches of a fixed row count. The gradient is a sum over micro-batches,
so the order changes nothing but the padding (the row counts, and so TRL's per-micro-batch normalisation,
stay as before).

``completion_logprobs`` projects the LM head (49k columns on SmolLM2) only at real completion positions.
TRL 1.16's fused head does that on CUDA but projects every position elsewhere (prompt and padding
included, twice: its backward recomputes the logits); on CPU that was most of a short-answer update.
``head_logprobs`` then keeps a micro-batch's (token x vocabulary) fp32 log-probs on CPU instead of TRL's
chunked recompute (its CPU fallback spends more on elementwise passes than on the projection).

**The shared prefix.** An agent's calls repeat most of their prompt: every call of a task starts with the
same system prompt and examples, a GRPO group's rollouts ask the same question, and a later call of an
episode starts with the earlier call's whole conversation. Padded as TRL lays a batch out (prompts
left-padded, completions right-padded), each row recomputes that prefix, forward and backward: on
SmolLM2's tool-agent batches most of the update.

``backbone_hidden`` finds ``p``, the number of leading real tokens every row of the micro-batch has in
common (at most the shortest prompt less one, so each row's last prompt position, which predicts its first
completion token, stays in its own part), runs them once as one row with a KV cache, repeats that cache
over the rows, and runs each row's rest against it::

    row i = pad ... pad | x_1 ... x_p | y_i,1 ... y_i,n_i           (x: shared, y: the row's own tokens)
    K, V  = layers(x_1..x_p)                                        one row, kept for the backward
    h_i   = layers(y_i | K, V), positions p, p + 1, ...             the rest left-padded after the prefix

Attention of ``y_i`` over ``[x; y_i]`` is the same set of keys at the same relative (rotary) positions
as in the padded row, so the hidden states, the log-probs and the gradients are the padded pass's, up to
float summation order (tested in fp32 to 2e-5 in log-probs; in bf16 both differ from fp32 alike). The
prefix's gradient is the sum of what every row sends back through the shared K and V, which is what the
padded rows' copies of it got separately.

Used where it is exact with transformers' dense attention (``sdpa`` or ``eager``), no activation
checkpointing (its recompute would write the cache twice) and no sliding window shorter than the row.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from spanrl.hf_compat import checkpointing_on, kv_cache_argument

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.algorithms.tables import PaddedBatch

__all__ = [
    "MIN_SHARED_PREFIX", "backbone_hidden", "bf16_supported", "completion_logprobs", "head_logprobs",
    "length_sorted_micro_batches", "padded_logprobs", "padded_tokens", "plain_lm_head", "shared_prefix_length",
    "update_autocast",
]

_VOCAB_CHUNK = 32768
"""Vocabulary columns per LM-head tile (TRL's chunk size)."""


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """Whether bf16 matmuls are fast here: a CUDA device with bf16, or a CPU with AVX512-BF16 or AMX."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def update_autocast(enabled: bool, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager:
    """bf16 autocast for a forward/backward when ``enabled``, else a context that does nothing."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def length_sorted_micro_batches(
    rows: torch.Tensor, prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, micro: int, *, sort: bool = True
) -> Iterator[torch.Tensor]:
    """``rows`` (indices) in micro-batches of ``micro`` rows; when ``sort``, longest prompt first, then
    longest completion (lengths indexed by row index).

    A micro-batch is padded to its longest prompt plus its longest completion (prompts left-padded,
    completions right-padded, as TRL lays them out), so sorting on the pair beats sorting on the total:
    a GRPO group's rollouts share one prompt and stay together, their completions sorted."""
    if sort:
        key = prompt_lengths[rows] * (int(completion_lengths.max()) + 1) + completion_lengths[rows]
        rows = rows[torch.argsort(key, descending=True, stable=True)]
    for start in range(0, len(rows), micro):
        yield rows[start : start + micro]


def padded_tokens(prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, batches: list[torch.Tensor]) -> int:
    """Positions a forward computes over ``batches`` (each padded to its longest prompt and completion)."""
    return sum(len(b) * int(prompt_lengths[b].max() + completion_lengths[b].max()) for b in batches if len(b))


def plain_lm_head(model: Any) -> bool:
    """Whether ``completion_logprobs`` computes ``model``'s log-probs exactly: a plain (or PEFT-wrapped)
    transformers model, unsharded, whose logits are the head's plain projection (soft-capping, scaling,
    FSDP wrappers and sharded DTensor weights are left to TRL's own path)."""
    from transformers import PreTrainedModel

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not isinstance(lm, PreTrainedModel) or type(lm.get_output_embeddings().weight.data) is not torch.Tensor:
        return False
    config = lm.config.get_text_config()
    scaled = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")
    return not any(getattr(config, name, None) is not None for name in scaled)


def padded_logprobs(model: Any, data: PaddedBatch, *, temperature: float, fp32_head: bool,
                    entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`completion_logprobs` of a padded batch (``tables.pad_transitions``): (B, C) log-probs (and entropies) of
    each completion token, 0 on padding."""
    input_ids = torch.cat([data.prompt_ids, data.completion_ids], dim=1)  # (B, P+C)
    attention = torch.cat([data.prompt_mask, data.completion_mask], dim=1).long()  # (B, P+C), HF wants numbers
    return completion_logprobs(model, input_ids, attention, data.completion_ids.size(1), temperature=temperature,
                               fp32_head=fp32_head, entropy=entropy)


def completion_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, *,
    temperature: float, fp32_head: bool, entropy: bool, share_prefix: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs (and entropies) of the last ``logits_to_keep`` tokens, zero where masked.

    The backbone runs over every position; the LM head only over completion positions whose token is
    attended (TRL's chunked log-prob kernel: no (N, vocab) logits kept). ``model`` is a causal LM or a
    PEFT model around one. ``fp32_head``: project in fp32 outside autocast (the ratio to the server's
    fp32 log-probs is then not bf16 rounding). ``share_prefix``: the rows' common leading tokens run once
    (the module docstring; the same log-probs)."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = backbone_hidden(lm, input_ids, attention_mask, logits_to_keep, share_prefix=share_prefix)
    hidden = hidden[:, -logits_to_keep - 1 : -1]  # position t predicts token t + 1
    targets = input_ids[:, -logits_to_keep:]
    mask = attention_mask[:, -logits_to_keep:].bool()
    head = lm.get_output_embeddings()
    rows = hidden[mask]
    context: contextlib.AbstractContextManager = contextlib.nullcontext()
    if fp32_head:
        rows, context = rows.float(), torch.autocast(rows.device.type, enabled=False)
    with context:
        logps, ent = head_logprobs(rows, head.weight, head.bias, targets[mask], temperature=temperature,
                                   entropy=entropy)
    scatter = lambda x: x.new_zeros(mask.shape).masked_scatter(mask, x)  # noqa: E731
    return scatter(logps), (scatter(ent) if ent is not None else None)


_SAVED_LOGPROBS_MAX = 1 << 27
"""Most (token x vocabulary) fp32 log-probs ``_DenseHeadLogProbs`` keeps for its backward (512 MiB); above
it, TRL's chunked kernel (which keeps none and recomputes the projection)."""


class _DenseHeadLogProbs(torch.autograd.Function):
    """Log-probs and entropies of ``rows @ weight.T / temperature``, fp32 on CPU, its (N, vocab) log-probs kept.

    TRL's chunked kernel keeps no logits: on CPU its backward redoes the projection and ~12 elementwise
    passes over each tile, and zero-fills a dense (vocab, hidden) weight gradient before accumulating into it.
    For a micro-batch's completion tokens the log-probs fit in memory: keeping them saves the projection's
    recompute, and the backward is two matmuls and two elementwise passes."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        logp = rows @ weight.t()
        if temperature != 1.0:
            logp.div_(temperature)
        logp.sub_(torch.logsumexp(logp, dim=-1, keepdim=True))  # log-softmax in place
        picked = logp.gather(1, targets[:, None]).squeeze(1)
        # vecdot, not bmm: CPU bmm's (1 x V) @ (V x 1) sums far less accurately
        ent = -torch.linalg.vecdot(logp.exp(), logp) if entropy else logp.new_zeros(0)
        ctx.save_for_backward(rows, weight, targets, logp, ent)
        ctx.temperature, ctx.entropy = temperature, entropy
        ctx.set_materialize_grads(False)
        if not entropy:
            ctx.mark_non_differentiable(ent)
        return picked, ent

    @staticmethod
    def backward(ctx: Any, grad_picked: torch.Tensor | None, grad_ent: torch.Tensor | None) -> tuple:
        rows, weight, targets, logp, ent = ctx.saved_tensors
        g = grad_picked if grad_picked is not None else logp.new_zeros(len(logp))
        # d log p_t / dz_j = 1[j = t] - p_j;  d H / dz_j = -p_j (log p_j + H)
        if ctx.entropy and grad_ent is not None and bool(grad_ent.any()):
            grad = (logp + ent[:, None]).mul_(-grad_ent[:, None]).sub_(g[:, None]).mul_(logp.exp())
        else:
            grad = logp.exp().mul_(-g[:, None])
        grad.scatter_add_(1, targets[:, None], g[:, None])
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        grad_rows = grad @ weight if ctx.needs_input_grad[0] else None
        grad_weight = grad.t() @ rows if ctx.needs_input_grad[1] else None
        return grad_rows, grad_weight, None, None, None


def head_logprobs(
    rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, *,
    temperature: float, entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` (and entropies) under ``rows @ weight.T + bias`` at ``temperature``, one per row:
    fp32 on CPU with its log-probs kept when they fit (``_DenseHeadLogProbs``), else TRL's chunked kernel."""
    if bias is None and _dense_head_fits(rows, weight):
        logps, ent = _DenseHeadLogProbs.apply(rows, weight, targets, temperature, entropy)
        return logps, (ent if entropy else None)
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    outputs = ("log_probs", "entropy") if entropy else ("log_probs",)
    logps, ent, *_ = ChunkedLogProbFunction.apply(
        rows, weight, bias, targets, temperature, _VOCAB_CHUNK, None, 1.0, outputs
    )
    return logps, ent


def _dense_head_fits(rows: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``_DenseHeadLogProbs`` serves: fp32 on CPU outside autocast, its kept log-probs within budget."""
    return (rows.device.type == "cpu" and rows.dtype == weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and rows.size(0) * weight.size(0) <= _SAVED_LOGPROBS_MAX)


# --- the shared prefix (module docstring) ---------------------------------------------------------
MIN_SHARED_PREFIX = 32
"""Fewest shared tokens worth a separate prefix pass (one more forward call, a cache copy per row)."""


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_width: int) -> int:
    """``p``: the leading real tokens all rows have in common (0 with one row), capped at the shortest
    prompt less one. Rows are ``[left-padded prompt | right-padded completion]``, the completion the last
    ``completion_width`` columns."""
    rows, width = input_ids.shape
    if rows < 2:
        return 0
    starts = attention_mask.bool().int().argmax(1)  # each row's first real column
    cap = int((width - completion_width - starts).min()) - 1
    if cap <= 0:
        return 0
    aligned = input_ids.gather(1, starts[:, None] + torch.arange(cap, device=input_ids.device)[None])
    same = (aligned == aligned[:1]).all(0)
    return cap if bool(same.all()) else int(same.int().argmin())


def _shareable(lm: Any, width: int) -> bool:
    config = lm.config.get_text_config()
    window = getattr(config, "sliding_window", None)
    return (getattr(config, "_attn_implementation", None) in ("sdpa", "eager")
            and not checkpointing_on(lm)
            and (window is None or not getattr(config, "use_sliding_window", True) or width <= window))


def backbone_hidden(lm: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_width: int,
                    *, share_prefix: bool = True) -> torch.Tensor:
    """The final hidden states of ``lm``'s backbone (a transformers causal LM's ``base_model``) whose last
    ``completion_width + 1`` positions are each row's last prompt position and its completion, as in the
    padded pass; with ``share_prefix`` the shared prefix runs once (the module docstring)."""
    body = lm.base_model
    p = shared_prefix_length(input_ids, attention_mask, completion_width) if share_prefix else 0
    if p < MIN_SHARED_PREFIX or not _shareable(lm, input_ids.size(1)):
        return body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    rows, width = input_ids.shape
    mask = attention_mask.bool()
    starts = mask.int().argmax(1)
    first = int(starts[0])
    key = kv_cache_argument(body)
    cache = getattr(body(input_ids=input_ids[:1, first : first + p], use_cache=True), key)
    cache.batch_repeat_interleave(rows)
    rest = width - int(starts.min()) - p  # the longest row's own tokens; shorter rows are left-padded
    columns = torch.arange(width - rest, width, device=input_ids.device)
    own = mask[:, width - rest :] & (columns[None] >= (starts + p)[:, None])
    positions = p + own.long().cumsum(1) - 1  # a padding position repeats its neighbour's: never attended
    attention = torch.cat([own.new_ones(rows, p), own], dim=1).long()
    return body(input_ids=input_ids[:, width - rest :], attention_mask=attention, position_ids=positions,
                use_cache=True, **{key: cache}).last_hidden_state
