"""Many processes (``accelerate launch`` / ``torchrun``): who serves, who only updates, and how they agree.

Rank 0 runs the rollout side (collector, policy server, agents, ``load_transitions``) and broadcasts each
update's transitions; every rank updates on its :func:`shard`; gradients are averaged with
:func:`average_gradients` right before the optimizer step, so the weights stay identical on every rank.
The algorithms drive TRL's ``training_step`` directly (never ``Trainer.train``), so TRL never wraps the
model in DDP: the explicit all-reduce is what keeps the ranks in step. Under one process every helper
is a no-op (``broadcast`` returns its argument, ``shard`` the whole list).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeVar

__all__ = ["average_gradients", "broadcast", "is_main", "rank", "shard", "world"]

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

        raise TrainingError(f"WORLD_SIZE={world()} but torch.distributed is not initialized: set up the algorithm first")
    import torch.distributed as dist

    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=_SRC_RANK)
    return box[0]


def shard(items: Sequence[_T]) -> list[_T]:
    """This rank's equal-sized share of ``items`` (rank r takes items r, r+world, ...).

    Shards are padded to the same length by repeating items from the start of the list, so every rank
    runs the same number of forward/backward passes and optimizer steps (collectives must match) and
    no item is dropped; with fewer items than ranks every rank still gets one.
    """
    n_ranks, me = world(), rank()
    items = list(items)
    if n_ranks == 1 or not items:
        return items
    size = -(-len(items) // n_ranks)  # ceil
    padded = items + [items[i % len(items)] for i in range(size * n_ranks - len(items))]
    return padded[me::n_ranks]


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
