"""spanrl.sweep: ``spanrl sweep SWEEP.yaml``, a grid or random search over train-config keys, each trial a
whole Trainer run under Ray Tune in its own folder (:mod:`~spanrl.sweep.search` documents the YAML)."""

from __future__ import annotations

from spanrl._lazy import lazy_getattr

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "SweepConfig": "spanrl.sweep.search",
    "run_sweep": "spanrl.sweep.search",
}

__all__ = sorted(_LAZY)
__getattr__ = lazy_getattr(__name__, _LAZY, globals())
