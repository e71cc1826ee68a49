"""The transformers backend: batched sampling with a KV cache, on CPU by default.

One batch = every choice of every request the batcher grouped. Prompts are left-padded, so all rows
decode in lockstep; each row has its own temperature, top-p, seed, stop strings and max_tokens, and a
row that finishes is dropped from the batch (and its KV cache) at once.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import pathlib
import threading
from collections.abc import Sequence
from typing import Any

import torch

from spanrl.errors import ServingError
from spanrl.hf_compat import kv_cache_argument
from spanrl.serving.adapters import AdapterSet, base_key
from spanrl.serving.backend import (
    BASE_ADAPTER,
    AdmitCallback,
    Completion,
    DoneCallback,
    GenerationRequest,
    base_adapter_folder,
    check_finite_weights,
)
from spanrl.serving.lean_llama import LeanCache, LeanLlama, supports
from spanrl.serving.config import PREFIX_CACHE_BYTES
from spanrl.serving.prefix_cache import PrefixCache

__all__ = ["TransformersBackend"]

_logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# transformers' from_pretrained builds the model under process-wide contexts (meta device, init
# patches): two loads at once in one process (servers reloading in parallel) can leave parameters on
# the meta device. Loads in this process take turns.
_LOAD_LOCK = threading.Lock()
_FALLBACK_CONTEXT_TOKENS = 2048


@dataclasses.dataclass
class _Row:
    """One choice being generated."""

    request: GenerationRequest
    choice: int
    generator: torch.Generator | None
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    max_new: int = 0
    peak: int = 0

    def completion(self) -> Completion:
        return Completion(self.token_ids, self.logprobs, self.text, self.finish_reason or "length", self.top)


class TransformersBackend:
    """A Hugging Face causal LM generating batches; see ``spanrl.serving.backend.Backend``."""

    def __init__(
        self,
        model_dir: str | pathlib.Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_context_tokens: int | None = None,
        seed: int = 0,
        adapters: dict[str, str | pathlib.Path] | None = None,
        enable_prefix_caching: bool = False,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
    ) -> None:
        """``adapters``: LoRA adapter name -> PEFT adapter folder, served beside the base (``AdapterSet``);
        ``enable_prefix_caching``: reuse cached prompt blocks where the lean forward runs (serving/prefix_cache.py)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            torch_dtype = "auto" if dtype == "auto" else _DTYPES[dtype]
            with _LOAD_LOCK:
                self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype)
        except (OSError, ValueError) as exc:
            raise ServingError(f"model: cannot load a causal LM from {str(model_dir)!r}: {exc}") from exc
        self.model.to(device).eval()
        self._cache_argument = kv_cache_argument(self.model)  # before adapters wrap the model
        self.device = torch.device(device)
        # transformers' forward without its per-call overhead, where its math is the model's (serving/lean_llama.py);
        # on CPU only: its logits were checked bit-identical there, not against a GPU's attention kernels
        self._lean = LeanLlama(self.model) if self.device.type == "cpu" and supports(self.model) else None
        self.prefix_cache = PrefixCache(prefix_cache_bytes) if enable_prefix_caching and self._lean else None
        config = self.model.config
        model_context = getattr(config, "max_position_embeddings", None) or _FALLBACK_CONTEXT_TOKENS
        self.max_context_tokens = min(max_context_tokens or model_context, model_context)
        self.pad_id = self._pad_id()
        self.stop_ids = self._stop_ids()
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        self.adapters = AdapterSet(self.model)
        for name, folder in (adapters or {}).items():
            self.adapters.load(name, folder)
        self._base: str | None = None  # BASE_ADAPTER once the base's weights came as an adapter folder
        self.generation_tokens = 0
        """Tokens generated since the start, every row's (``/metrics``: vLLM's ``generation_tokens_total``)."""

    @property
    def adapter_names(self) -> list[str]:
        """The LoRA adapters served beside the base model (by name)."""
        return [name for name in self.adapters.names if name != BASE_ADAPTER]

    # --- weights ----------------------------------------------------------------------------------
    def load_weights(self, source: Any, adapter: str | None = None) -> None:
        """Copy new weights in place: a folder path, a ``state_dict`` or a module (copied, not kept); with
        ``adapter``, that adapter's weights (``AdapterSet.load``), the base and other adapters untouched. A PEFT
        adapter folder as the base's weights: the base's requests run with it from then on (``BASE_ADAPTER``)."""
        if self.prefix_cache is not None:  # cached keys and values belong to the old weights
            self.prefix_cache.clear()
        if adapter is not None:
            self.adapters.load(adapter, source)
            return
        folder = base_adapter_folder(source)
        if folder is not None:  # checked and loaded (or refused) before requests use it
            self.adapters.load(BASE_ADAPTER, folder)
            self._base = BASE_ADAPTER
            return
        if isinstance(source, (str, pathlib.Path)):
            from transformers import AutoModelForCausalLM

            try:
                with _LOAD_LOCK:
                    loaded = AutoModelForCausalLM.from_pretrained(
                        str(source), dtype=self.model.dtype, local_files_only=True
                    )
            except (OSError, ValueError) as exc:
                raise ServingError(f"path: cannot load weights from {str(source)!r}: {exc}") from exc
            state = loaded.state_dict()
        elif hasattr(source, "merge_and_unload"):  # a PEFT model: merge a copy, leave the trainer's untouched
            state = copy.deepcopy(source).merge_and_unload().state_dict()
        elif isinstance(source, torch.nn.Module):
            state = source.state_dict()
        elif isinstance(source, dict):
            state = source
        else:
            raise ServingError(
                f"weights must be a path, a state_dict or a torch.nn.Module, got {type(source).__name__}"
            )
        # with adapters loaded, the base's own weights (PEFT moved adapted ones under base_layer), by plain key
        own = {base_key(k): v for k, v in self.model.state_dict().items() if ".lora_" not in k}
        missing = [k for k in own if k not in state and not _is_tied_copy(k, own)]
        unexpected = [k for k in state if k not in own]
        if missing or unexpected:
            raise ServingError(
                f"weights do not fit the served model: missing {missing[:3]}{'...' if len(missing) > 3 else ''}, "
                f"unexpected {unexpected[:3]}{'...' if len(unexpected) > 3 else ''}"
            )
        for key, tensor in state.items():
            if own[key].shape != tensor.shape:
                raise ServingError(f"weights: {key} has shape {tuple(tensor.shape)}, the model {tuple(own[key].shape)}")
        check_finite_weights(state)
        with torch.no_grad():  # checked first, so a bad source leaves the old weights whole
            for key, tensor in state.items():
                target = own[key]
                target.copy_(tensor.detach().to(device=target.device, dtype=target.dtype))
        self._base = None  # whole weights: the base alone again

    def close(self) -> None:
        """Drop the model."""
        self.model = None  # type: ignore[assignment]

    # --- generation -------------------------------------------------------------------------------
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Generate every choice of every request together; see the module docstring."""
        done: dict[int, list[Completion]] = {}
        self.run(requests, on_done=lambda req, completions, _size: done.__setitem__(id(req), completions))
        return [done[id(req)] for req in requests]

    @torch.inference_mode()
    def run(
        self,
        requests: Sequence[GenerationRequest],
        *,
        on_done: DoneCallback,
        admit: AdmitCallback | None = None,
    ) -> None:
        """Continuous batching: generate ``requests``, call ``on_done(request, completions, batch_size)``
        as soon as each request's choices are all finished, and between decode steps take new requests
        from ``admit(active_rows)`` into the running batch (prefilled, then merged into the KV cache).
        Returns when no row is left and ``admit`` gives nothing. ``batch_size`` is the most rows
        generated together during that request's life."""
        dev = self.device
        adapter = requests[0].adapter if requests else None
        self.adapters.use(adapter if adapter is not None else self._base)
        rows: list[_Row] = []
        cache: Any = None
        mask = next_pos = logits = torch.empty(0)
        unfinished: dict[int, int] = {}
        pending = list(requests)
        while True:
            if pending:
                if any(req.adapter != adapter for req in pending):  # the batcher groups by adapter; never mix
                    raise ServingError(f"a batch for adapter {adapter!r} was given requests for another adapter")
                new_rows = self._rows(pending)
                for req in pending:
                    unfinished[id(req)] = req.n
                new_cache, new_mask, new_pos, new_logits = self._prefill(new_rows)
                if cache is None or not rows:
                    cache, mask, next_pos, logits = new_cache, new_mask, new_pos, new_logits
                else:
                    cache, mask = _merge(cache, mask, new_cache, new_mask)
                    next_pos, logits = torch.cat([next_pos, new_pos]), torch.cat([logits, new_logits])
                rows += new_rows
                pending = []
            for row in rows:
                row.peak = max(row.peak, len(rows))
            temps = torch.tensor([r.request.params.temperature for r in rows], dtype=torch.float32)
            top_ps = torch.tensor([r.request.params.top_p for r in rows], dtype=torch.float32)
            tokens, token_lps, tops = self._sample(logits, rows, temps, top_ps)
            keep: list[int] = []
            for j, row in enumerate(rows):
                if self._append(row, tokens[j], token_lps[j], tops[j] if tops else None):
                    keep.append(j)
                    continue
                unfinished[id(row.request)] -= 1
                if unfinished[id(row.request)] == 0:
                    del unfinished[id(row.request)]
                    mine = sorted((r for r in rows if r.request is row.request), key=lambda r: r.choice)
                    on_done(row.request, [r.completion() for r in mine], max(r.peak for r in mine))
            if len(keep) < len(rows):
                index = torch.tensor(keep, dtype=torch.long)
                if keep:
                    cache.batch_select_indices(index.to(dev))
                mask, next_pos = mask[index], next_pos[index]
                tokens = [tokens[j] for j in keep]
                rows = [rows[j] for j in keep]
            if rows:
                mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
                cache, mask = _trim(cache, mask)
                step_ids = torch.tensor(tokens, dtype=torch.long)[:, None]
                logits = self._forward(step_ids.to(dev), mask.to(dev), next_pos[:, None].to(dev), cache)
                next_pos = next_pos + 1
            if admit is not None:
                pending = list(admit(len(rows)))
            if not rows and not pending:
                return

    def _rows(self, requests: Sequence[GenerationRequest]) -> list[_Row]:
        rows = [
            _Row(
                request=req,
                choice=i,
                generator=None if req.params.seed is None else torch.Generator().manual_seed(req.params.seed + i),
                max_new=min(req.params.max_tokens, self.max_context_tokens - len(req.prompt_ids)),
            )
            for req in requests
            for i in range(req.n)
        ]
        for row in rows:
            if row.max_new < 1:
                raise ServingError(f"prompt of {len(row.request.prompt_ids)} tokens leaves no room in the context")
        return rows

    def _prefill(self, rows: list[_Row]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left-padded prompts through the model: (cache, mask (B, W), next positions (B,), logits (B, V))."""
        from transformers import DynamicCache

        if self.prefix_cache is not None and self._lean_now():
            return self.prefix_cache.prefill(self._lean, [r.request.prompt_ids for r in rows], self.pad_id)
        width = max(len(r.request.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            prompt = row.request.prompt_ids
            ids[b, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[b, width - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self._lean.new_cache() if self._lean_now() else DynamicCache(config=self.model.config)
        dev = self.device
        logits = self._forward(ids.to(dev), mask.to(dev), positions.to(dev), cache)
        return cache, mask, positions[:, -1] + 1, logits

    def _lean_now(self) -> bool:
        """The lean forward, unless LoRA adapters replaced the linear layers it reads."""
        return self._lean is not None and self.adapters.peft is None

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        if isinstance(cache, LeanCache):
            return self._lean(ids, mask, positions, cache)
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
            **{self._cache_argument: cache}
        )
        return out.logits[:, -1, :].float()

    def _sample(
        self, logits: torch.Tensor, rows: list[_Row], temps: torch.Tensor, top_ps: torch.Tensor
    ) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
        """Sample one token per row; return ids, their logprobs and the top alternatives."""
        greedy = temps <= 0
        scaled = logits / torch.where(greedy, torch.ones_like(temps), temps).to(logits.device)[:, None]
        logp = torch.log_softmax(scaled, dim=-1).cpu()  # (B, V)
        chosen = logp.argmax(dim=-1)  # (B,)
        sample_rows = [b for b in range(len(rows)) if not greedy[b]]
        if sample_rows:
            probs = logp[sample_rows].exp()
            probs = _top_p_filter(probs, top_ps[sample_rows])
            shared = [k for k, b in enumerate(sample_rows) if rows[b].generator is None]
            if shared:
                picked = torch.multinomial(probs[shared], 1, generator=self._generator).squeeze(1)
                for k, tok in zip(shared, picked.tolist()):
                    chosen[sample_rows[k]] = tok
            for k, b in enumerate(sample_rows):
                if rows[b].generator is not None:
                    chosen[b] = torch.multinomial(probs[k], 1, generator=rows[b].generator).item()
        token_lps = logp.gather(1, chosen[:, None]).squeeze(1)
        tops: list[list[tuple[int, float]]] = []
        want = max(r.request.params.top_logprobs for r in rows)
        if want:
            values, indices = logp.topk(want, dim=-1)
            tops = [
                list(zip(indices[b, : r.request.params.top_logprobs].tolist(),
                         values[b, : r.request.params.top_logprobs].tolist()))

                for b, r in enumerate(rows)
            ]
        return chosen.tolist(), token_lps.tolist(), tops

    def _append(self, row: _Row, token: int, logprob: float, top: list[tuple[int, float]] | None) -> bool:
        """Record one token; return whether the row goes on."""
        self.generation_tokens += 1  # the batcher's one thread: no lock
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        if row.request.params.top_logprobs:
            row.top.append(top or [])
        if row.request.on_token is not None:
            try:
                row.request.on_token(row.choice, token, logprob)
            except Exception:  # a broken stream must not stop the batch
                _logger.exception("token callback failed")
        if row.request.cancelled:  # the client went away: stop spending the batch on it
            row.finish_reason = "abort"
        elif token in self.stop_ids:
            row.finish_reason = "stop"
        elif len(row.token_ids) >= row.max_new:
            row.finish_reason = "length"
        if row.finish_reason is not None or row.request.params.stop:  # decode only when the text is needed
            row.text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        for stop in row.request.params.stop:
            at = row.text.find(stop)
            if at >= 0:
                row.text = row.text[:at]
                row.finish_reason = "stop"
                break
        return row.finish_reason is None

    def _pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, 0):
            if candidate is not None:
                return int(candidate)
        return 0  # pragma: no cover

    def _stop_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            ids.update(int(i) for i in gen_eos)
        return frozenset(ids)


def _top_p_filter(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Zero the tail of each row beyond its top-p mass (the most likely token always stays)."""
    if bool((top_ps >= 1.0).all()):
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above
    drop_sorted = before >= top_ps[:, None]
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    return probs.masked_fill(drop, 0.0)


def _is_tied_copy(key: str, own: dict[str, torch.Tensor]) -> bool:
    """``lm_head.weight`` may be absent from a state_dict of a model with tied embeddings."""
    return key.endswith("lm_head.weight") and any(k.endswith("embed_tokens.weight") for k in own)


def _merge(cache: Any, mask: torch.Tensor, other: Any, other_mask: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Stack two KV caches along the batch, left-padding the shorter one (its mask is 0 there)."""
    width = max(mask.shape[1], other_mask.shape[1])

    def pad(t: torch.Tensor, missing: int) -> torch.Tensor:  # (B, H, L, D) -> (B, H, missing + L, D)
        if not missing:
            return t
        return torch.cat([t.new_zeros(t.shape[0], t.shape[1], missing, t.shape[3]), t], dim=2)

    for mine, theirs in zip(cache.layers, other.layers):
        a, b = width - mine.keys.shape[2], width - theirs.keys.shape[2]
        mine.keys = torch.cat([pad(mine.keys, a), pad(theirs.keys, b)], dim=0)
        mine.values = torch.cat([pad(mine.values, a), pad(theirs.values, b)], dim=0)
    masks = [torch.nn.functional.pad(m, (width - m.shape[1], 0)) for m in (mask, other_mask)]
    return cache, torch.cat(masks, dim=0)


def _trim(cache: Any, mask: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Drop leading columns that are padding in every row (left after long rows finished)."""
    first = int(mask.any(dim=0).to(torch.int8).argmax())
    if first == 0:
        return cache, mask
    for layer in cache.layers:
        layer.keys = layer.keys[:, :, first:]
        layer.values = layer.values[:, :, first:]
    return cache, mask[:, first:]
