"""spanrl.ui: the viewer, ``spanrl ui``. Rollouts, one rollout's span tree beside the training rows and
credit it produced, runs' curves, and a read-only SQL box, in the browser.

    spanrl ui --db spanrl-demo/spans.duckdb         # or, while a collector runs: spanrl ui --url http://127.0.0.1:4318

It reads through a running collector's read-only SQL endpoint or a DuckDB file opened read-only, serves
on loopback by default, asks for the collector's bearer token when one is set, and ships every asset
(plain JS, SVG charts) in the package: no CDN, works offline. A raw ASGI app on uvicorn; it needs the
``spanrl[collector]`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spanrl._lazy import lazy_getattr

# public name -> module that defines it; loaded on first use, so `spanrl <command> --help` and the
# agent-side install import this package without its extra (duckdb, pyarrow, ...).
_LAZY: dict[str, str] = {
    "Source": "spanrl.ui.source",
    "UiApp": "spanrl.ui.app",
    "open_source": "spanrl.ui.source",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.ui.app import UiApp
    from spanrl.ui.source import Source, open_source
