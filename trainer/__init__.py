"""spanrl.trainer: the loop around the algorithms.

The ``Trainer`` (collect rollouts, load transitions, update, reload, report), the services it owns,
checkpoints, reporting callbacks and plots, the curriculum and APO's prompt search. Learning from live
traffic is :mod:`spanrl.online`, a source of this loop.
Running agents is :mod:`spanrl.rollouts`; the demo is :mod:`spanrl.demo`. Public names are loaded on
first use, so importing one part does not import torch.
"""

from __future__ import annotations

from spanrl._lazy import lazy_getattr

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "LLMEndpoint": "spanrl.rollouts.runner",
    "RunnerConfig": "spanrl.rollouts.runner",
    "Trainer": "spanrl.trainer.trainer",
    "TrainerConfig": "spanrl.trainer.trainer",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
