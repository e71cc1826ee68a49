"""Where transformers' API moved between the versions spanrl supports (5.17, on the lent GPU machines'
image, to 5.24): one answer for the trainer's forward (``algorithms/batching.py``) and the server's
(``serving/hf_backend.py``). Imports nothing heavy: each function takes the model it asks about."""

from __future__ import annotations

import functools
import inspect
from typing import Any

__all__ = ["checkpoint_activations", "checkpointing_args", "checkpointing_on", "kv_cache_argument"]


def kv_cache_argument(module: Any) -> str:
    """The name of ``module.forward``'s KV-cache argument, which is also its output's field: ``cache`` in
    transformers 5.2x, ``past_key_values`` before (5.17 ignores an unknown ``cache=`` silently)."""
    return _kv_cache_argument(type(module))


@functools.lru_cache(maxsize=None)
def _kv_cache_argument(cls: type) -> str:  # once per model class: the update asks every micro-batch
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def checkpointing_args(args_class: type, enabled: bool) -> dict[str, bool]:
    """The training arguments' field that turns activation checkpointing on or off, set to ``enabled``: TRL's
    configs default it to on (each forward recomputed in the backward), and transformers 5.2x renamed it
    (``activation_checkpointing``; the old ``gradient_checkpointing`` warns there) from 5.17's name."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(args_class)}
    return {"activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing": enabled}


def checkpointing_on(model: Any) -> bool:
    """Whether activation checkpointing is on (the newer property first: the older name warns there)."""
    newer = hasattr(type(model), "is_activation_checkpointing")
    return bool(getattr(model, "is_activation_checkpointing" if newer else "is_gradient_checkpointing", False))


def checkpoint_activations(model: Any) -> None:
    """Turn on activation (gradient) checkpointing, non-reentrant (it works with LoRA's frozen inputs), by the
    newer name where it exists, else the older one."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable({"use_reentrant": False})
    else:  # pragma: no cover - an older transformers
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
