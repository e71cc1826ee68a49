"""The interface every generation backend implements, and the values that cross it.

A backend is owned by one thread (the batcher): ``generate`` and ``load_weights`` are never called
concurrently, so a backend needs no locks of its own.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = [
    "BASE_ADAPTER",
    "AdmitCallback",
    "Backend",
    "Completion",
    "DoneCallback",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "TokenCallback",
    "base_adapter_folder",
    "check_finite_weights",
]

BASE_ADAPTER = "spanrl/base"
"""Where a backend keeps a LoRA adapter reloaded as the base's weights (``base_adapter_folder``): requests for
the base then run with it. Adapter names never hold '/' (``ServerConfig.lora_modules``, the reload route), so no
named adapter can take this one's place."""


def base_adapter_folder(source: Any) -> pathlib.Path | None:
    """``source`` as a folder when a reload of the base names a PEFT adapter folder (``adapter_config.json``): the
    served model's name then answers with base + that adapter, so a Trainer's one LoRA policy (``algorithm.lora``)
    reaches a server as its adapter alone, not as a merged model. None for anything else (full weights)."""
    if isinstance(source, (str, pathlib.Path)) and (pathlib.Path(source) / "adapter_config.json").is_file():
        return pathlib.Path(source)
    return None


TokenCallback = Callable[[int, int, float], None]
"""Called from the batcher thread as ``(choice_index, token_id, logprob)`` for every new token."""


DoneCallback = Callable[["GenerationRequest", list["Completion"], int], None]
"""Called as ``(request, completions, batch_size)`` when every choice of a request is finished."""

AdmitCallback = Callable[[int], Sequence["GenerationRequest"]]
"""Called with the number of rows still generating; returns requests to join the running batch."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one request's completions."""

    max_tokens: int
    """Most completion tokens per choice."""
    temperature: float = 1.0
    """0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    seed: int | None = None
    """Choice ``i`` samples from its own generator seeded ``seed + i``; None uses the server's."""
    stop: tuple[str, ...] = ()
    """Strings that end a completion; the returned text stops before them."""
    top_logprobs: int = 0
    """How many most likely alternatives to report per position (0..20)."""


@dataclasses.dataclass
class GenerationRequest:
    """One prompt, ``n`` completions."""

    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    on_token: TokenCallback | None = None
    adapter: str | None = None
    """The LoRA adapter to generate with (its served name); None: the base model."""
    cancelled: bool = False
    """Set (from any thread) when the client went away: the backend ends its rows at the next decode step, with
    finish reason ``abort``."""


@dataclasses.dataclass
class Completion:
    """One generated choice. ``token_ids`` are exactly the sampled ids, the end token included;
    ``text`` is their decoding without special tokens, cut before a stop string if one matched."""

    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each sampled id under the distribution it was sampled from: softmax of the
    logits divided by the temperature (temperature 0: plain softmax), before top-p truncation."""
    text: str
    finish_reason: str
    """``stop`` (end token or stop string), ``length`` (max_tokens or the context was reached) or ``abort`` (the
    request was cancelled)."""
    top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    """Per position, the ``top_logprobs`` most likely (id, logprob) pairs; empty unless asked."""


@dataclasses.dataclass
class GenerationResult:
    """The completions of one request and how they were made."""

    prompt_ids: list[int]
    completions: list[Completion]
    batch_size: int
    """Sequences generated together in the batch that produced this result."""
    policy_version: int
    """The version of the weights that made it: the adapter's own version for an adapter's request."""
    adapter: str | None = None
    """The adapter that made it (None: the base model)."""


class Backend(Protocol):
    """A model that generates batches of requests and can swap its weights."""

    tokenizer: Any
    """A Hugging Face tokenizer (chat template, encode, decode)."""
    max_context_tokens: int
    """Prompt + completion limit."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[Completion]]:
        """Completions for each request, in order (``n`` each). Raises if the batch failed."""
        ...

    def load_weights(self, source: Any, adapter: str | None = None) -> None:
        """Swap in new weights: a folder path, a ``state_dict`` or a ``torch.nn.Module``; with ``adapter``,
        that LoRA adapter's (added when new). A backend without adapters refuses ``adapter``."""
        ...

    def close(self) -> None:
        """Free the model."""
        ...


def check_finite_weights(state: Any) -> None:
    """Raise `ServingError` naming the first floating-point tensor of ``state`` (name -> tensor) that holds
    a NaN or an infinity. Backends call it before they copy anything, so refused weights leave the served
    ones whole (issue 28: one reward of 1e200 gave a checkpoint of NaN, and every request then failed)."""
    import torch

    from spanrl.errors import ServingError

    bad = [key for key, tensor in state.items()
           if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ServingError(
            f"weights: {bad[0]} is not finite (NaN or inf){more}; refused, the previous weights are still served"
        )

