"""spanrl.store: the DuckDB span store (schema, views, SQL access, export, prune).

    from spanrl.store import SpanStore
    store = SpanStore.open("spanrl.duckdb", read_only=True)
    store.sql("SELECT * FROM rollouts")            # -> pyarrow.Table
"""

from __future__ import annotations

from spanrl.store._spanstore import READ_STATEMENT_TYPES, SpanStore

__all__ = ["READ_STATEMENT_TYPES", "SpanStore"]
