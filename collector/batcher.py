"""Group commit into DuckDB: a bounded queue of encoded requests drained by one writer thread.

Receivers call `Batcher.consume(batch)` and get a future that resolves once the batch's spans are
committed (the receiver acknowledges only then). The writer thread takes every queued request (up to
``max_batch_spans``) into one transaction, commits, then resolves all their futures: under load, many
requests share one disk commit. When the queued bytes would pass ``max_queue_bytes`` the request is
refused with `RetryableError` (UNAVAILABLE / 503 + Retry-After): memory stays bounded and nothing
accepted is ever dropped. Bytes count from queueing until their commit ends; a request larger than the
whole limit is still taken when nothing else is queued, so it cannot be refused forever.

The writer thread commits through `SpanWriter`: one INSERT ... SELECT through its own cursor on the store's
shared connection, returning after the commit (DuckDB has then written its WAL), so an acknowledged span
survives a SIGKILL of the collector. When DuckDB invalidates the database (a FATAL error: a failed
checkpoint, disk full, out of memory while pinning a block), every later statement fails. The writer then
reopens the file (the WAL holds every commit) and asks the reopened store whether the failed commit landed,
since DuckDB can raise after writing the WAL: the batch is acknowledged if it did and inserted again if not,
so no request is acknowledged or refused wrongly. If the file cannot be reopened the writer turns
``failed``: every request gets a retryable refusal and ``spanrl collector`` exits non-zero for its supervisor.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Protocol

import duckdb
import pyarrow as pa

from spanrl.collector.encoding import EncodedBatch
from spanrl.collector.errors import PermanentError, RetryableError, StoreFailedError
from spanrl.errors import ConfigError, StoreError
from spanrl.store import SpanStore, duckdb_errors

__all__ = ["Batcher", "BatcherConfig", "SpanWriter", "TableConsumer"]

_logger = logging.getLogger(__name__)

_DEFAULT_MAX_QUEUE_BYTES = 256 * 1024 * 1024
_DEFAULT_MAX_BATCH_SPANS = 32_768
_DEFAULT_RETRY_AFTER_S = 1


class TableConsumer(Protocol):
    """What the batcher hands committed work to: the DuckDB writer."""

    def consume(self, tables: list[pa.Table]) -> None:
        """Store all ``tables`` in one transaction, or raise (then nothing of them is stored)."""


@dataclass
class BatcherConfig:
    """Settings of the group-commit queue."""

    max_queue_bytes: int = _DEFAULT_MAX_QUEUE_BYTES
    """Arrow bytes that may wait for the writer; past it requests get UNAVAILABLE / 503."""
    max_batch_spans: int = _DEFAULT_MAX_BATCH_SPANS
    """Most spans the writer puts in one transaction (one request is never split)."""
    retry_after_s: int = _DEFAULT_RETRY_AFTER_S
    """Retry-After hint, seconds, sent with a refusal."""

    def validate(self) -> None:
        """Raise `ConfigError` naming the first bad field."""
        if self.max_queue_bytes < 1:
            raise ConfigError(f"max_queue_bytes must be at least 1, got {self.max_queue_bytes}")
        if self.max_batch_spans < 1:
            raise ConfigError(f"max_batch_spans must be at least 1, got {self.max_batch_spans}")
        if self.retry_after_s < 0:
            raise ConfigError(f"retry_after_s must be 0 or more, got {self.retry_after_s}")


class Batcher:
    """Bounded queue + writer thread doing group commits into ``next_consumer``."""

    def __init__(self, config: BatcherConfig, next_consumer: TableConsumer) -> None:
        config.validate()
        self._config = config
        self._next = next_consumer
        self._queue: collections.deque[tuple[pa.Table, int, Future[int], int]] = collections.deque()
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.committed_spans = 0
        """Spans committed since start (read without a lock: a statistic)."""
        self.commits = 0
        """Transactions committed since start."""

    @property
    def queued_bytes(self) -> int:
        """Arrow bytes waiting for the writer now."""
        return self._queued_bytes

    def start(self) -> None:
        """Start the writer thread."""
        if self._thread is not None:
            raise RuntimeError("Cannot start a batcher twice")
        self._thread = threading.Thread(target=self._run, name="spanrl-writer", daemon=True)
        self._thread.start()

    def consume(self, batch: EncodedBatch) -> "Future[int]":
        """Queue the batch; the future gives the number of spans committed. Does not block.

        The batcher keeps ``batch.table`` until it is committed. Raises `RetryableError` when the
        queue is full or the batcher is shutting down.
        """
        fut: Future[int] = Future()
        if batch.table is None or batch.accepted == 0:
            fut.set_result(0)
            return fut
        size = batch.table.nbytes
        with self._cond:
            if self._stopping or self._thread is None:
                raise RetryableError("the collector is not accepting spans (shutting down or not started)",
                                     retry_after_s=self._config.retry_after_s)
            if self._queued_bytes and self._queued_bytes + size > self._config.max_queue_bytes:
                raise RetryableError(
                    f"write queue full ({self._queued_bytes} of {self._config.max_queue_bytes} bytes queued); "
                    "retry later",
                    retry_after_s=self._config.retry_after_s,
                )
            self._queue.append((batch.table, batch.accepted, fut, size))
            self._queued_bytes += size
            self._cond.notify()
        return fut

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop taking requests, commit everything queued, stop the thread. Safe before start or twice."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                _logger.error("writer thread did not finish within %.1f s; %d bytes still queued",
                              timeout or 0, self._queued_bytes)


    def _take(self) -> list[tuple[pa.Table, int, Future[int], int]] | None:
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            taken = [self._queue.popleft()]
            spans = taken[0][1]
            while self._queue and spans + self._queue[0][1] <= self._config.max_batch_spans:
                item = self._queue.popleft()
                taken.append(item)
                spans += item[1]
            return taken

    def _release(self, items: list[tuple[pa.Table, int, Future[int], int]]) -> None:
        with self._cond:
            self._queued_bytes -= sum(item[3] for item in items)

    def _run(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            try:
                self._commit(items)
            finally:
                self._release(items)

    def _commit(self, items: list[tuple[pa.Table, int, Future[int], int]]) -> None:
        try:
            self._next.consume([item[0] for item in items])
        except Exception as exc:  # noqa: BLE001 - the writer thread must survive any store failure
            if len(items) == 1:
                _logger.warning("commit of %d spans failed: %s", items[0][1], exc)
                items[0][2].set_exception(exc)
                return
            # One bad request must not fail its neighbours: commit each alone.
            for item in items:
                self._commit([item])
            return
        self.commits += 1
        for _, n, fut, _ in items:
            self.committed_spans += n
            fut.set_result(n)


# --- the writer: Arrow tables -> DuckDB ----------------------------------------------------------------
# DuckDB errors caused by the data itself: retrying the same request cannot help.
_PERMANENT_DUCKDB_ERRORS = (duckdb.ConversionException, duckdb.ConstraintException, duckdb.InvalidInputException)
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
        """``ok``; ``failing`` while commits fail (a full disk: until one succeeds); ``recovering`` while the
        store is reopened; ``failed`` when it could not be."""
        self.last_error: str | None = None
        """The DuckDB error of the last failed commit, recovery or failure."""
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
            if not duckdb_errors.invalidated(exc):
                # /health says so until a commit succeeds (it said "ok" with the disk full)
                self.state, self.last_error = "failing", str(exc).splitlines()[0]
                raise RetryableError(f"span store write failed: {exc}") from exc
            self._recover(table, exc)
        else:
            if self.state == "failing":
                _logger.warning("span store writes succeed again (after: %s)", self.last_error)
                self.state = "ok"

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
