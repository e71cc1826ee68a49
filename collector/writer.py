"""The DuckDB writer: Arrow tables from the batcher -> one INSERT ... SELECT and one commit.

Runs only on the batcher's writer thread, through its own cursor on the store's shared connection.
`consume` returns after the commit (DuckDB has then written its WAL), so an acknowledged span survives
a SIGKILL of the collector.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from spanrl.collector.errors import PermanentError, RetryableError
from spanrl.store import SpanStore

__all__ = ["SpanWriter"]

# DuckDB errors caused by the data itself: retrying the same request cannot help.
_PERMANENT_DUCKDB_ERRORS = (duckdb.ConversionException, duckdb.ConstraintException, duckdb.InvalidInputException)


class SpanWriter:
    """Appends Arrow span batches to a `SpanStore`."""

    def __init__(self, store: SpanStore) -> None:
        self._store = store
        self._cursor: duckdb.DuckDBPyConnection | None = None

    def consume(self, tables: list[pa.Table]) -> None:
        """Insert all ``tables`` in one transaction. Does not keep them after returning.

        Raises `PermanentError` when the data cannot be stored, `RetryableError` for anything else
        (disk full, store closed): nothing of the tables is then stored.
        """
        if self._cursor is None:
            self._cursor = self._store.cursor()
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        try:
            self._store.append(table, cursor=self._cursor)
        except _PERMANENT_DUCKDB_ERRORS as exc:
            self._reset()
            raise PermanentError(f"spans cannot be stored: {exc}") from exc
        except Exception as exc:  # noqa: BLE001
            self._reset()
            raise RetryableError(f"span store write failed: {exc}") from exc

    def shutdown(self, timeout: float | None = None) -> None:
        """Close the writer's cursor. Safe twice."""
        self._reset()

    def _reset(self) -> None:
        if self._cursor is not None:
            try:
                self._cursor.close()
            except Exception:  # noqa: BLE001
                pass
            self._cursor = None
