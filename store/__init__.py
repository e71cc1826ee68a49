"""spanrl.store: the DuckDB span store (schema, views, SQL access, export, prune).

    from spanrl.store import SpanStore
    store = SpanStore.open("spanrl.duckdb", read_only=True)
    store.sql("SELECT * FROM rollouts")            # -> pyarrow.Table

While a collector holds the file, other processes use ``RemoteStore(url).sql(...)`` (same result type).
"""

from __future__ import annotations

from spanrl.store._spanstore import READ_STATEMENT_TYPES, SpanStore
from spanrl.store.maintenance import EXPORT_TABLES, export_parquet, parse_duration_s, prune
from spanrl.store.remote import RemoteStore

__all__ = [
    "EXPORT_TABLES", "READ_STATEMENT_TYPES", "RemoteStore", "SpanStore", "export_parquet", "parse_duration_s", "prune",
]

