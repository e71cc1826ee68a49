"""What the store's readers accept besides a DuckDB connection: anything with ``sql(query, params)``."""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa

__all__ = ["SqlSource"]


class SqlSource(Protocol):
    """A :class:`~spanrl.store.SpanStore`, a :class:`~spanrl.store.RemoteStore` (the collector's SQL endpoint),
    or anything else that answers a query with a ``pyarrow.Table``."""

    def sql(self, query: str, params: Any = None) -> pa.Table: ...
