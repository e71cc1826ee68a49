"""Automatic prefix caching for the transformers backend's lean Llama forward, as vLLM users know it: a prompt's
keys and values are kept in blocks of ``BLOCK_TOKENS`` tokens, found by content, and a later prompt that starts
with cached blocks prefills only the rest.

Why: an agent's calls share long prefixes (few-shot examples, a system prompt, the episode so far), and GRPO
sends each prompt n times. Without a cache every row recomputes them: the calc-verify probe's ~700-token shot
prefix was most of a study step's CPU.

- **Blocks by content.** A block is keyed by (its parent block's entry id, its token ids): a dict look-up with
  exact equality, so two prompts share a block only if every token up to its end is the same (no hash collision
  can hand one prompt another's keys). Only full blocks of prompts are kept, never a completion's tokens.
- **At least one token is computed**: a hit never covers a prompt's last token, whose logits start the decode.
- **LRU within a byte budget** (``ServerConfig.prefix_cache_bytes``). A look-up touches a chain's blocks from its
  last to its first, so a parent is always used more recently than its children and leaves are evicted first.
- **Shared prompts in one batch are computed once**: when rows of a batch share an uncached block (the n choices
  of a request, requests that share few-shot examples), the first such prompt is prefilled alone first and its
  blocks stored; the batch then finds them.
- **New weights empty it** (``clear``): keys and values are a function of the weights.

A hit changes which matrix shapes compute a row (the suffix alone, its keys beside cached ones), so logits can
differ from a prefill without it in their last bits, as batching already makes them (docs/serving.md, "Prefix
caching"); a seeded ``deterministic: true`` run turns the cache off.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import torch

from spanrl.serving.config import PREFIX_CACHE_BYTES
from spanrl.serving.lean_llama import LeanCache, LeanLlama

__all__ = ["BLOCK_TOKENS", "PrefixCache"]

BLOCK_TOKENS = 16  # vLLM's default block size

_ROOT = 0  # the parent id of a prompt's first block


class PrefixCache:
    """Prompt blocks' keys and values for one model's current weights; see the module docstring."""

    def __init__(self, max_bytes: int = PREFIX_CACHE_BYTES, block_tokens: int = BLOCK_TOKENS) -> None:
        self.max_bytes = max_bytes
        self.block_tokens = block_tokens
        # (parent id, block token ids) -> (entry id, kv (layers, 2, kv heads, block, head dim))
        self._blocks: collections.OrderedDict[tuple[int, tuple[int, ...]], tuple[int, torch.Tensor]] = (
            collections.OrderedDict())
        self._next_id = _ROOT + 1
        self.bytes = 0
        self.queries = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
        self.hits = 0  # of them, found cached (vLLM's prefix_cache_hits)
        self.prefill_tokens = 0  # prompt tokens put through the model, shared prompts' first pass included

    def clear(self) -> None:
        """Forget every block (the weights changed); the counters go on."""
        self._blocks.clear()
        self.bytes = 0

    # --- the blocks -------------------------------------------------------------------------------
    def _chain(self, ids: Sequence[int]) -> list[tuple[tuple[int, tuple[int, ...]], int, torch.Tensor]]:
        """The cached blocks ``ids`` starts with, at most ``len(ids) - 1`` tokens: (key, entry id, kv) each."""
        chain: list[tuple[tuple[int, tuple[int, ...]], int, torch.Tensor]] = []
        parent, size = _ROOT, self.block_tokens
        for start in range(0, len(ids) - size, size):  # the last token stays out of any hit
            key = (parent, tuple(ids[start:start + size]))
            found = self._blocks.get(key)
            if found is None:
                break
            chain.append((key, *found))
            parent = found[0]
        return chain

    def _lookup(self, ids: Sequence[int]) -> list[torch.Tensor]:
        """The kv of each cached block ``ids`` starts with, in order (each (layers, 2, kv heads, block, head dim))."""
        chain = self._chain(ids)
        for key, _, _ in reversed(chain):  # children first: parents end up the more recently used
            self._blocks.move_to_end(key)
        return [kv for _, _, kv in chain]

    def _store(self, ids: Sequence[int], kv: torch.Tensor, start: int) -> None:
        """Keep the full blocks of ``ids`` from token ``start`` (block-aligned) on; ``kv`` holds tokens ``start:``."""
        parent, size = _ROOT, self.block_tokens
        stored: list[tuple[int, tuple[int, ...]]] = []
        for begin in range(0, len(ids) - size + 1, size):
            key = (parent, tuple(ids[begin:begin + size]))
            found = self._blocks.get(key)
            if found is None:
                if begin < start:  # an earlier block was evicted meanwhile: the chain is broken here
                    break
                block = kv[:, :, :, begin - start:begin - start + size].clone()
                found = self._blocks[key] = (self._next_id, block)
                self._next_id += 1
                self.bytes += block.numel() * block.element_size()
            stored.append(key)
            parent = found[0]
        for key in reversed(stored):
            self._blocks.move_to_end(key)
        while self.bytes > self.max_bytes and self._blocks:
            _, (_, block) = self._blocks.popitem(last=False)
            self.bytes -= block.numel() * block.element_size()

    # --- the prefill ------------------------------------------------------------------------------
    def prefill(self, lean: LeanLlama, prompts: Sequence[Sequence[int]],
                pad_id: int) -> tuple[LeanCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The backend's prefill with the cache: (cache, mask (B, W), next positions (B,), logits (B, V))."""
        self._share(lean, prompts, pad_id)
        return self._prefill(lean, prompts, pad_id)

    def _share(self, lean: LeanLlama, prompts: Sequence[Sequence[int]], pad_id: int) -> None:
        """Prefill alone, first, each prompt whose first uncached block other rows of the batch share."""
        size, done = self.block_tokens, set()
        for ids in prompts:
            if tuple(ids) in done:
                continue
            done.add(tuple(ids))
            cached = len(self._chain(ids)) * size
            if len(ids) - 1 - cached < size:  # no uncached block a hit could use
                continue
            head = list(ids[:cached + size])
            if sum(list(other[:cached + size]) == head for other in prompts) > 1:
                self._prefill(lean, [ids], pad_id, count=False)

    def _prefill(self, lean: LeanLlama, prompts: Sequence[Sequence[int]], pad_id: int, *,
                 count: bool = True) -> tuple[LeanCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each row: its cached prefix as past keys, the rest through the model; then its new full blocks stored.
        Row b's columns: [padding | cached | padding | the rest], the mask 0 on padding."""
        chains = [self._lookup(ids) for ids in prompts]
        hits = [len(chain) * self.block_tokens for chain in chains]
        past, size = max(hits), self.block_tokens
        width = max(len(ids) - hit for ids, hit in zip(prompts, hits))
        rows = len(prompts)
        ids_t = torch.full((rows, width), pad_id, dtype=torch.long)
        mask = torch.zeros((rows, past + width), dtype=torch.long)
        cache = lean.new_cache()
        kv_past = None
        if past:
            shape = next(chain[0] for chain in chains if chain).shape
            kv_past = torch.zeros((shape[0], 2, rows, shape[2], past, shape[4]), dtype=lean.embed.dtype)
        for b, (ids, hit, chain) in enumerate(zip(prompts, hits, chains)):
            rest = len(ids) - hit
            ids_t[b, width - rest:] = torch.tensor(list(ids[hit:]), dtype=torch.long)
            mask[b, past + width - rest:] = 1
            mask[b, past - hit:past] = 1
            for j, block in enumerate(chain):  # copied straight into the batch's past: no per-row copy first
                kv_past[:, :, b, :, past - hit + j * size:past - hit + (j + 1) * size] = block
        if kv_past is not None:
            for layer, kv in zip(cache.layers, kv_past):
                layer.keys, layer.values = kv[0], kv[1]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        logits = lean(ids_t, mask, positions, cache)
        self.prefill_tokens += sum(len(ids) - hit for ids, hit in zip(prompts, hits))
        if count:
            self.queries += sum(len(ids) for ids in prompts)
            self.hits += sum(hits)
        for b, (ids, hit) in enumerate(zip(prompts, hits)):
            if len(ids) // self.block_tokens * self.block_tokens > hit:
                cols = mask[b].nonzero().squeeze(1)[hit:]
                kv = torch.stack([torch.stack([layer.keys[b][:, cols], layer.values[b][:, cols]])
                                  for layer in cache.layers])
                self._store(ids, kv, hit)
        return cache, mask, positions[:, -1] + 1, logits
