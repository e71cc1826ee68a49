"""spanrl.demo: ``spanrl demo``, the whole pipeline on a tiny model, and its parts.

The demo's run (:mod:`~spanrl.demo.demo`), the tiny-model builder tests and examples use too
(:mod:`~spanrl.demo.tiny`) and the calculator agent with its tasks and careless demonstrator
(:mod:`spanrl.demo.calculator`), all shipped in the wheel so the demo needs no source checkout; and
``spanrl demo --model smollm2``, a real model learning a calculator tool agent (:mod:`spanrl.demo.smollm2`).
"""

from __future__ import annotations

from spanrl._lazy import lazy_getattr

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "DemoConfig": "spanrl.demo.demo",
    "DemoResult": "spanrl.demo.demo",
    "run_demo": "spanrl.demo.demo",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())
