"""Many processes (``accelerate launch`` / ``torchrun``): who serves, who only updates, and how they agree.

Rank 0 runs the rollout side (collector, policy server, agents, ``load_transitions``) and broadcasts each
update's transitions; every rank updates on its :func:`shard_transitions`; gradients are averaged with
:func:`average_gradients` right before the optimizer step, so the weights stay identical on every rank.
The algorithms drive TRL's ``training_step`` directly (never ``Trainer.train``), so TRL never wraps the
model in DDP: the explicit all-reduce is what keeps the ranks in step. Under one process every helper
is a no-op (``broadcast`` returns its argument, ``shard`` the whole list, ``all_reduce_sum`` its values).

Under an FSDP launch (``fsdp.yaml``) GRPO shards the model and optimizer with FSDP2
(:mod:`spanrl.algorithms.sharding`): FSDP reduce-scatters the mean gradient, so :func:`average_gradients`
does not run there; everything else here (broadcast, shards, global token count) is the same.

The update equals the one-process update on the same batch: each rank's loss is normalised by the
*global* token count (:func:`all_reduce_sum`), shards are padded with inert copies (no loss tokens,
zero advantage) rather than duplicates, and the logged loss, KL and reward are reduced over ranks.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = [
    "all_reduce_sum", "average_gradients", "broadcast", "inert_copy", "is_main", "launch_flag", "rank",
    "refuse_sharding", "shard", "shard_transitions", "world",
]

_T = TypeVar("_T")
_SRC_RANK = 0


def _initialized() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return dist.is_available() and dist.is_initialized()


def world() -> int:
    """Number of training processes (``WORLD_SIZE`` before the process group exists; 1 when alone)."""
    if _initialized():
        import torch.distributed as dist

        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's rank (``RANK`` before the process group exists; 0 when alone)."""
    if _initialized():
        import torch.distributed as dist

        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def is_main() -> bool:
    """True on the process that runs rollouts, serves, logs and saves (rank 0)."""
    return rank() == _SRC_RANK


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` (any picklable object) on every rank; the argument itself when alone."""
    if world() == 1:
        return obj
    if not _initialized():
        from spanrl.errors import TrainingError

        raise TrainingError(
            f"WORLD_SIZE={world()} but torch.distributed is not initialized: set up the algorithm first"
        )
    import torch.distributed as dist

    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=_SRC_RANK)
    return box[0]


def shard(items: Sequence[_T], pad: Callable[[_T], _T] | None = None) -> list[_T]:
    """This rank's equal-sized share of ``items`` (rank r takes items r, r+world, ...).

    Shards are padded to the same length with ``pad(item)`` of items from the start of the list (the
    items themselves when ``pad`` is None), so every rank runs the same number of forward/backward passes
    and optimizer steps (collectives must match) and no item is dropped; with fewer items than ranks
    every rank still gets one.
    """
    n_ranks, me = world(), rank()
    items = list(items)
    if n_ranks == 1 or not items:
        return items
    size = -(-len(items) // n_ranks)  # ceil
    fill = pad or (lambda item: item)
    padded = items + [fill(items[i % len(items)]) for i in range(size * n_ranks - len(items))]
    return padded[me::n_ranks]


def inert_copy(transition: _T) -> _T:
    """A copy of a transition that moves nothing: no loss token, zero advantage and reward weight.

    It pads a shard so the ranks run the same passes; it adds no gradient and no token to the loss's
    normaliser, so a padded split trains exactly like the unsplit batch (duplicates would count twice)."""
    return dataclasses.replace(  # type: ignore[type-var]
        transition, completion_mask=[0] * len(transition.completion_mask), advantage=0.0,  # type: ignore[attr-defined]
        token_advantages=[],
    )


def shard_transitions(items: Sequence[_T]) -> list[_T]:
    """This rank's share of a batch of transitions, padded with :func:`inert_copy` rows."""
    return shard(items, pad=inert_copy)


def all_reduce_sum(values: Sequence[float]) -> list[float]:
    """The element-wise sum of ``values`` over ranks (``values`` itself when alone); every rank must call it."""
    if world() == 1 or not _initialized():
        return [float(v) for v in values]
    import torch
    import torch.distributed as dist

    box = torch.tensor([float(v) for v in values], dtype=torch.float64)
    dist.all_reduce(box, op=dist.ReduceOp.SUM)
    return box.tolist()


def average_gradients(params: Sequence[Any]) -> None:
    """All-reduce every parameter's gradient to the mean over ranks (a no-op when alone).

    A parameter without a gradient on this rank contributes zeros, so every rank calls the same
    collectives in the same order."""
    n_ranks = world()
    if n_ranks == 1 or not _initialized():
        return
    import torch
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(n_ranks)


def launch_flag(name: str, default: str = "false") -> bool:
    """A true/false variable ``accelerate launch`` sets (``ACCELERATE_USE_FSDP``, ``FSDP_OFFLOAD_PARAMS``, ...)."""
    return os.environ.get(name, default).lower() in ("1", "true", "yes")


def refuse_sharding(algorithm: str, *, fsdp: bool = False, lora: bool = False) -> None:
    """Raise :class:`ConfigError` when launched with a sharding configuration the update cannot honour.

    DeepSpeed (``ACCELERATE_USE_DEEPSPEED``): always refused. The update drives TRL's ``training_step`` on
    its own model and never builds the DeepSpeed engine (``deepspeed_engine_wrapped`` is None: the first
    backward would crash mid-step, after the rollouts), and deepspeed is not a dependency.
    FSDP (``ACCELERATE_USE_FSDP``): refused unless the algorithm shards (``fsdp=True``: GRPO, through
    :mod:`spanrl.algorithms.sharding`), and then only for the configurations that module cannot honour.
    Refused at setup, before any rollout."""
    from spanrl.errors import ConfigError

    if launch_flag("ACCELERATE_USE_DEEPSPEED"):
        raise ConfigError(
            f"{algorithm} cannot train under accelerate's DeepSpeed configuration (ACCELERATE_USE_DEEPSPEED is set): "
            "the update does not build a DeepSpeed engine (it would be missing at the first backward) and "
            "deepspeed is not installed with spanrl; launch with examples/accelerate/fsdp.yaml (FSDP2, sharded) or "
            "examples/accelerate/ddp.yaml (data parallel) instead"
        )
    if launch_flag("ACCELERATE_USE_FSDP"):
        if not fsdp:
            raise ConfigError(
                f"{algorithm} cannot train under accelerate's FSDP configuration (ACCELERATE_USE_FSDP is set): "
                "only GRPO shards its update; launch with examples/accelerate/ddp.yaml instead"
            )
        check_fsdp(algorithm, lora=lora)


def check_fsdp(algorithm: str, *, lora: bool) -> None:
    """Raise :class:`ConfigError` for the FSDP configurations the sharded update (algorithms/sharding.py)
    cannot honour."""
    from spanrl.errors import ConfigError

    why = None
    if os.environ.get("FSDP_VERSION", "1") != "2":
        why = f"fsdp_version is {os.environ.get('FSDP_VERSION', '1 (the default)')}; set fsdp_version: 2 (FSDP2)"
    elif launch_flag("FSDP_OFFLOAD_PARAMS"):
        why = "fsdp_offload_params: true is not supported; set it to false"
    elif lora:
        why = "LoRA adapters are not sharded; train LoRA with examples/accelerate/ddp.yaml"
    if why:
        raise ConfigError(
            f"{algorithm} cannot train under accelerate's FSDP configuration (ACCELERATE_USE_FSDP is set): {why}"
        )

