"""spanrl.ui: the viewer, ``spanrl ui``. Rollouts, one rollout's span tree beside the training rows and
credit it produced, runs' curves, and a read-only SQL box, in the browser.

    spanrl ui --db spanrl-demo/spans.duckdb         # or, while a collector runs: spanrl ui --url http://127.0.0.1:4318

It reads through a running collector's read-only SQL endpoint or a DuckDB file opened read-only, serves
on loopback by default, asks for the collector's bearer token when one is set, and ships every asset
(plain JS, SVG charts) in the package: no CDN, works offline. A raw ASGI app on uvicorn, so it needs no
extra beyond ``pip install spanrl``.
"""

from __future__ import annotations

from spanrl.ui.app import UiApp
from spanrl.ui.source import Source, open_source

__all__ = ["Source", "UiApp", "open_source"]
