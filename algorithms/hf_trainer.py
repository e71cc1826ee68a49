"""What SFT and DPO share around the Hugging Face Trainer they build for each update."""

from __future__ import annotations

from typing import Any

__all__ = ["without_train_start_gc"]


def without_train_start_gc(trainer: Any) -> None:
    """Skip the full ``gc.collect()`` an HF Trainer runs at the start of ``train()``.

    ``Trainer.train`` calls ``accelerator.free_memory()``, which drops the accelerator's references and
    runs the garbage collector: ~0.17 s of a 0.21 s SFT update on the tiny model here. SFT and DPO build
    a fresh trainer (and so a fresh accelerator holding nothing) per update, so only the reset is kept.
    """
    accelerator = trainer.accelerator

    def free_memory(*objects: Any) -> Any:
        accelerator._schedulers, accelerator._optimizers, accelerator._models, accelerator._dataloaders = [], [], [], []
        accelerator.step = 0
        return objects[0] if len(objects) == 1 else objects

    accelerator.free_memory = free_memory
