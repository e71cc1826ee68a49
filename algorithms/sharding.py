"""FSDP2 for the GRPO update: each rank holds ~1/N of the parameters, gradients and optimizer state.

``accelerate launch --config_file examples/accelerate/fsdp.yaml`` sets ``ACCELERATE_USE_FSDP`` and the
``FSDP_*`` variables. accelerate 1.15 itself never enables FSDP on CPU (``AcceleratorState`` takes the
FSDP branch only for GPU-like device types; a CPU run is ``MULTI_CPU``), and the update drives TRL's
``training_step`` without ``Trainer.train`` (which is where transformers would ``accelerator.prepare``
the model and optimizer). So :class:`Sharding` applies torch's ``fully_shard`` (FSDP2) itself, on CPU
(gloo) and GPU alike, with the config's wrap policy: every transformer block its own FSDP unit, then the
root. It must run before the optimizer is built (``fully_shard`` replaces the parameters with DTensors).

FSDP reduce-scatters the gradient *mean* over ranks, so the explicit ``average_gradients`` of the DDP
path does not run; the loss normalisation by the global token count stays. Whatever needs full weights
gets them from :meth:`Sharding.gather`, a collective every rank calls after setup, a resume and each update: rank 0
then holds the full model state dict (server reload, checkpoint) and the full optimizer state
(checkpoint), both on CPU; the other ranks hold nothing.

Refused (``ConfigError`` at setup, before any rollout): ``fsdp_version: 1`` (this path is FSDP2),
``fsdp_offload_params: true`` (not wired or tested) and LoRA (PEFT adapters are not sharded here).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from spanrl.algorithms.distributed import launch_flag
from spanrl.errors import ConfigError

__all__ = ["Sharding", "fsdp_requested", "local_numel", "optimizer_state_numel"]


def fsdp_requested() -> bool:
    """True when launched with an FSDP configuration (``ACCELERATE_USE_FSDP``) under several processes."""
    from spanrl.algorithms.distributed import world

    return launch_flag("ACCELERATE_USE_FSDP") and world() > 1


def local_numel(model: torch.nn.Module) -> int:
    """Parameter elements this rank holds (a DTensor's local shard; a plain tensor whole)."""
    return sum(_local(p).numel() for p in model.parameters())


def optimizer_state_numel(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer-state elements this rank holds (Adam: exp_avg and exp_avg_sq; scalar steps not counted)."""
    return sum(
        _local(v).numel()
        for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v) and v.dim()
    )


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _block_classes(model: torch.nn.Module) -> set[str]:
    """The module classes that become FSDP units: the config's list, else the model's ``_no_split_modules``."""
    if os.environ.get("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP") == "NO_WRAP":
        return set()
    named = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "")
    return {c.strip() for c in named.split(",") if c.strip()} or set(getattr(model, "_no_split_modules", None) or ())


class Sharding:
    """One model (and its optimizer, once built) sharded with FSDP2 over every rank."""

    def __init__(self, model: torch.nn.Module) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from spanrl.algorithms.distributed import world

        if any(p.is_meta for p in model.parameters()):  # transformers loaded rank 0 only (efficient loading)
            raise ConfigError(
                "FSDP: this rank's model was loaded without weights (fsdp_cpu_ram_efficient_loading: true with the "
                "process group already up); set fsdp_cpu_ram_efficient_loading: false: every rank loads, then shards"
            )
        self.model = model
        self.optimizer: torch.optim.Optimizer | None = None
        self.full_numel = sum(p.numel() for p in model.parameters())
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda":
            model.to(torch.device("cuda", torch.cuda.current_device()))
        mesh = init_device_mesh(device, (world(),))
        reshard = launch_flag("FSDP_RESHARD_AFTER_FORWARD", "true")
        blocks = _block_classes(model)
        for module in list(model.modules()):
            if type(module).__name__ in blocks:
                fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        self.weights: dict[str, torch.Tensor] = {}
        """Rank 0: the full state dict after the last :meth:`gather` (CPU); other ranks: empty."""
        self.optimizer_state: dict[str, Any] = {}
        """Rank 0: the full (parameter-name keyed) optimizer state after the last :meth:`gather`."""

    def gather(self) -> None:
        """Collective (every rank, same point): full weights and optimizer state onto rank 0's CPU."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        self.weights = get_model_state_dict(self.model, options=options)
        # Not before the first step: on an empty optimizer, get_optimizer_state_dict initialises the state
        # with a step of its own (Adam's step count becomes 1 and the first real step's bias correction changes).
        if self.optimizer is not None and self.optimizer.state:
            state = get_optimizer_state_dict(self.model, self.optimizer, options=options)
            for entry in state.get("state", {}).values():  # scalar ``step`` tensors come back as the live objects
                entry.update({k: v.clone() for k, v in entry.items() if torch.is_tensor(v) and not v.dim()})
            self.optimizer_state = state

    def grad_norm_and_clip(self, params: list[torch.nn.Parameter], max_norm: float) -> float:
        """The global pre-clip gradient norm over every rank's shard; clips in place when ``max_norm`` > 0."""
        if max_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def saved_model(self) -> Any:
        """What :func:`save_checkpoint` saves as the policy: the model, writing rank 0's gathered weights."""
        return _SavedModel(self.model, self.weights)

    def saved_optimizer(self) -> Any:
        """What :func:`save_checkpoint` saves and :func:`load_checkpoint` restores as the optimizer."""
        return _SavedOptimizer(self)

    def loaded_model(self) -> Any:
        """What :func:`load_checkpoint` loads full weights into (every rank reads the checkpoint)."""
        return _LoadedModel(self.model)


class _SavedModel:
    def __init__(self, model: Any, weights: dict[str, torch.Tensor]) -> None:
        self._model, self._weights = model, weights

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The gathered full weights (what is saved; checked finite before saving)."""
        return self._weights

    def save_pretrained(self, directory: Any) -> None:
        if not self._weights:
            from spanrl.errors import TrainingError

            raise TrainingError("no gathered weights to save: under FSDP only rank 0 saves")
        self._model.save_pretrained(directory, state_dict=self._weights)


class _LoadedModel:
    def __init__(self, model: Any) -> None:
        self._model = model

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shards as plain tensors (checked finite after a load; a bad shard stops its rank,
        and torchrun the others)."""
        return {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in self._model.state_dict().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(self._model, state, options=StateDictOptions(full_state_dict=True))


class _SavedOptimizer:
    def __init__(self, sharding: Sharding) -> None:
        self._sharding = sharding

    def state_dict(self) -> dict[str, Any]:
        return self._sharding.optimizer_state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        sharding = self._sharding
        set_optimizer_state_dict(sharding.model, sharding.optimizer, state,
                                 options=StateDictOptions(full_state_dict=True))

        sharding.gather()  # rank 0's copies match the resumed state (a save before the next update)
