"""spanrl.store: the DuckDB span store (schema, views, SQL access, export, prune).

    from spanrl.store import SpanStore
    store = SpanStore.open("spanrl.duckdb", read_only=True)
    store.sql("SELECT * FROM rollouts")            # -> pyarrow.Table

While a collector holds the file, other processes use ``RemoteStore(url).sql(...)`` (same result type).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spanrl._lazy import lazy_getattr

# public name -> module that defines it; loaded on first use, so `spanrl <command> --help` and the
# agent-side install import this package without its extra (duckdb, pyarrow, ...).
_LAZY: dict[str, str] = {
    "EXPORT_TABLES": "spanrl.store.maintenance",
    "READ_STATEMENT_TYPES": "spanrl.store._spanstore",
    "RemoteStore": "spanrl.store.remote",
    "SpanStore": "spanrl.store._spanstore",
    "export_parquet": "spanrl.store.maintenance",
    "parse_duration_s": "spanrl.store.maintenance",
    "prune": "spanrl.store.maintenance",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY, globals())

if TYPE_CHECKING:  # pragma: no cover
    from spanrl.store._spanstore import READ_STATEMENT_TYPES, SpanStore
    from spanrl.store.maintenance import EXPORT_TABLES, export_parquet, parse_duration_s, prune
    from spanrl.store.remote import RemoteStore
