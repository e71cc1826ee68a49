"""The DuckDB writer: Arrow tables from the batcher -> one INSERT ... SELECT and one commit.

Runs only on the batcher's writer thread, through its own cursor on the store's shared connection.
`consume` returns after the commit (DuckDB has then written its WAL), so an acknowledged span survives
a SIGKILL of the collector.

When DuckDB invalidates the database (a FATAL error: a failed checkpoint, disk full, out of memory
while pinning a block), every later statement fails. The writer then reopens the file (the WAL holds
every commit) and asks the reopened store whether the failed commit landed, since DuckDB can raise
after writing the WAL: the batch is acknowledged if it did and inserted again if not, so no request
is acknowledged or refused wrongly. If the file cannot be reopened the writer turns ``failed``: every
request gets a retryable refusal and ``spanrl collector`` exits non-zero for its supervisor.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import duckdb
import pyarrow as pa

from spanrl.collector.errors import PermanentError, RetryableError, StoreFailedError
from spanrl.errors import StoreError
from spanrl.store import SpanStore

__all__ = ["SpanWriter"]

_logger = logging.getLogger(__name__)

# DuckDB errors caused by the data itself: retrying the same request cannot help.
_PERMANENT_DUCKDB_ERRORS = (duckdb.ConversionException, duckdb.ConstraintException, duckdb.InvalidInputException)
# Errors after which DuckDB refuses every statement until the database is opened again.
_FATAL_DUCKDB_ERRORS = (duckdb.FatalException, duckdb.InternalException)
_INVALIDATED = "database has been invalidated"
_REOPEN_ATTEMPTS = 3
_REOPEN_BACKOFF_S = 0.5
_PROBE_VIEW = "__spanrl_reconcile_batch"
_COMBINE_MAX_BYTES = 32 * 1024 * 1024
_JSON_COLUMNS = ("attributes", "resource", "events", "links")
_ARROW_JSON = pa.json_(pa.string()) if hasattr(pa, "json_") else None  # pyarrow >= 19


def _for_insert(tables: list[pa.Table]) -> pa.Table:
    """The tables as one, in one Arrow chunk when that copy is small: DuckDB scans each chunk as a task
    and with one chunk per request its parallel insert cost 30% more CPU (bench: agent spans 8.9 -> 6.4
    us/span, 8 requests per commit). Past `_COMBINE_MAX_BYTES` the copy would add to peak memory.
    The JSON columns are labelled Arrow JSON (no copy), so DuckDB takes them as its JSON type instead of
    parsing every value to validate a VARCHAR -> JSON cast (~0.35 us/span): orjson wrote them."""
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    if table.nbytes <= _COMBINE_MAX_BYTES and any(c.num_chunks > 1 for c in table.columns):
        table = table.combine_chunks()
    if _ARROW_JSON is None:
        return table
    for name in _JSON_COLUMNS:
        i = table.schema.get_field_index(name)
        if i >= 0 and table.schema.field(i).type == pa.string():
            column = table.column(i)
            as_json = pa.chunked_array(
                [pa.ExtensionArray.from_storage(_ARROW_JSON, c) for c in column.chunks], _ARROW_JSON
            )
            table = table.set_column(i, name, as_json)
    return table


def _is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, _FATAL_DUCKDB_ERRORS) or _INVALIDATED in str(exc)


class SpanWriter:
    """Appends Arrow span batches to a `SpanStore`; reopens it after a fatal DuckDB error."""

    def __init__(self, store: SpanStore, *, on_failed: Callable[[str], None] | None = None,
                 reopen_attempts: int = _REOPEN_ATTEMPTS, reopen_backoff_s: float = _REOPEN_BACKOFF_S) -> None:
        self._store = store
        self._cursor: duckdb.DuckDBPyConnection | None = None
        self._generation = -1
        self._on_failed = on_failed
        self._attempts = reopen_attempts
        self._backoff_s = reopen_backoff_s
        self._lock = threading.Lock()
        self.state = "ok"
        """``ok``; ``recovering`` while the store is reopened; ``failed`` when it could not be."""
        self.last_error: str | None = None
        """The DuckDB error that caused the last recovery (or the failure)."""
        self.recoveries = 0
        """Times the store was reopened after a fatal error."""

    def consume(self, tables: list[pa.Table]) -> None:
        """Insert all ``tables`` (from `encode_request`: its JSON columns are trusted as JSON) in one
        transaction. Does not keep them after returning.

        Raises `PermanentError` when the data cannot be stored, `RetryableError` for anything else
        (disk full, store closed, store failed): nothing of the tables is then stored.
        """
        if self.state == "failed":
            raise StoreFailedError(f"the span store failed and could not be reopened: {self.last_error}")
        table = _for_insert(tables)
        try:
            self._store.append(table, cursor=self._writer_cursor())
        except _PERMANENT_DUCKDB_ERRORS as exc:
            self._reset()
            raise PermanentError(f"spans cannot be stored: {exc}") from exc
        except Exception as exc:  # noqa: BLE001
            self._reset()
            if not _is_fatal(exc):
                raise RetryableError(f"span store write failed: {exc}") from exc
            self._recover(table, exc)

    def shutdown(self, timeout: float | None = None) -> None:
        """Close the writer's cursor. Safe twice."""
        self._reset()

    # --- recovery ----------------------------------------------------------------------------------
    def _recover(self, table: pa.Table, exc: BaseException) -> None:
        first_line = str(exc).splitlines()[0]
        self.last_error = first_line
        self.state = "recovering"
        _logger.error("DuckDB invalidated the span store (%s); reopening %s", first_line, self._store.path)
        for attempt in range(self._attempts):
            try:
                self._store.reopen()
                break
            except StoreError as reopen_exc:
                self.last_error = f"{first_line}; reopening failed: {reopen_exc}"
                _logger.error("reopening the span store failed (attempt %d of %d): %s",
                              attempt + 1, self._attempts, reopen_exc)
                time.sleep(self._backoff_s * 2**attempt)
        else:
            self.state = "failed"
            if self._on_failed is not None:
                self._on_failed(self.last_error)
            raise StoreFailedError(f"the span store failed and could not be reopened: {self.last_error}") from exc
        try:
            if not self._already_stored(table):
                self._store.append(table, cursor=self._writer_cursor())
        except Exception as again:  # noqa: BLE001 - the reopened store refuses: retryable, not stored
            self._reset()
            self.state = "ok"
            raise RetryableError(f"span store write failed after reopening: {again}") from again
        self.state = "ok"
        self.recoveries += 1
        _logger.warning("span store reopened; the failed commit is settled and ingest goes on")

    def _already_stored(self, table: pa.Table) -> bool:
        """Whether every (trace_id, span_id) of ``table`` is in the store: a commit is all or nothing."""
        cur = self._writer_cursor()
        ids = table.select(["trace_id", "span_id"])
        cur.register(_PROBE_VIEW, ids)
        try:
            row = cur.execute(
                f"SELECT (SELECT count(*) FROM (SELECT DISTINCT trace_id, span_id FROM {_PROBE_VIEW})),"
                f" (SELECT count(*) FROM (SELECT DISTINCT trace_id, span_id FROM {_PROBE_VIEW}) b"
                f"  SEMI JOIN spans s ON s.trace_id = b.trace_id AND s.span_id = b.span_id)"
            ).fetchall()[0]
        finally:
            cur.unregister(_PROBE_VIEW)
        stored = bool(row and row[0] == row[1])
        _logger.warning("the failed commit of %d spans %s", table.num_rows,
                        "had landed" if stored else "had not landed; inserting it again")

        return stored

    def _writer_cursor(self) -> duckdb.DuckDBPyConnection:
        if self._cursor is None or self._generation != self._store.generation:
            self._reset()
            self._generation = self._store.generation
            self._cursor = self._store.cursor()
        return self._cursor

    def _reset(self) -> None:
        if self._cursor is not None:
            try:
                self._cursor.close()
            except Exception:  # noqa: BLE001
                pass
            self._cursor = None
