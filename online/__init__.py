"""spanrl.online: learning from production traffic.

The ``OnlineTrainer`` follows a running collector and policy server: it trains on the live rollouts that are
ready past its watermark, exactly once (its ledger and ``online_state.json`` are the commit point), guards each
update against a fall of the live reward, and drives the Trainer's one loop (``spanrl.trainer.training_step``)
as a ``Source``, as ``spanrl.sweep`` drives whole Trainer runs: this room sits above ``trainer/``.
``spanrl train --online`` is its command (``_cli.py``). Public names load on first use (no torch on import).
"""

from __future__ import annotations

from spanrl._lazy import lazy_getattr

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "OnlineConfig": "spanrl.online.config",
    "OnlineTrainer": "spanrl.online.trainer",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
