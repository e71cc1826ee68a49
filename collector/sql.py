"""The read-only SQL endpoint's engine: its own bounded thread pool and a time limit per query.

Queries never run on the threads that decode OTLP, so no number of slow queries delays ingest; at most
``max_waiting`` run or wait at once (more get a retryable refusal). Each is bounded end to end: DuckDB
is interrupted after ``timeout_s`` (running or handing over rows), the rows are read a batch at a time
and stop past ``max_rows`` / ``max_bytes``, and a response that took longer than ``timeout_s`` to build,
or came out larger than ``max_bytes``, is refused all the same (400 naming the limit). What a query may
do is `SpanStore.read_sql`'s business: one plain SELECT (or EXPLAIN of one), in a read-only
transaction rolled back, on a store opened ``sandboxed`` (no file access, settings locked).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import orjson
import pyarrow as pa

from spanrl.collector.errors import RetryableError
from spanrl.errors import StoreError
from spanrl.store import SpanStore

__all__ = ["SqlRunner"]


class SqlRunner:
    """Runs `SpanStore.read_sql` on a private pool, bounded and timed."""

    def __init__(self, store: SpanStore, *, workers: int, max_waiting: int, timeout_s: float, retry_after_s: int,
                 max_rows: int, max_bytes: int) -> None:
        self._store = store
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="spanrl-sql")
        self._slots = threading.BoundedSemaphore(max_waiting)
        self._max_waiting = max_waiting
        self._timeout_s = timeout_s
        self._retry_after_s = retry_after_s
        self._max_rows, self._max_bytes = max_rows, max_bytes

    async def query(self, sql: str, params: Sequence[Any] | dict[str, Any] | None, *, arrow: bool) -> bytes:
        """The rows of ``sql`` as an Arrow IPC stream (``arrow``) or JSON ``{"columns", "rows"}``."""
        if not self._slots.acquire(blocking=False):
            raise RetryableError(f"{self._max_waiting} SQL queries are running or waiting, the limit; retry later",
                                 retry_after_s=self._retry_after_s)
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, self._run, sql, params, arrow)
        finally:
            self._slots.release()

    def _run(self, sql: str, params: Sequence[Any] | dict[str, Any] | None, arrow: bool) -> bytes:
        started = time.monotonic()
        table = self._store.read_sql(sql, params, timeout_s=self._timeout_s, max_rows=self._max_rows,
                                     max_bytes=self._max_bytes)
        body = _arrow_ipc(table) if arrow else _rows_json(table)
        if len(body) > self._max_bytes:  # JSON: text is larger than the Arrow bytes counted while reading
            raise StoreError(f"the response is {len(body)} bytes, more than {self._max_bytes}, the limit "
                             "(sql_max_bytes): select fewer columns or rows, or raise the collector's --sql-max-bytes")
        took = time.monotonic() - started
        if took > self._timeout_s:
            raise StoreError(f"SQL took {took:.1f} s with its response, longer than the time limit of "
                             f"{self._timeout_s:g} s (sql_timeout_s)")
        return body

    def shutdown(self) -> None:
        """Stop the pool (queries still running are waited for). Safe twice."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _arrow_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _rows_json(table: pa.Table) -> bytes:
    return orjson.dumps({"columns": table.column_names, "rows": table.to_pylist()},
                        default=str, option=orjson.OPT_SERIALIZE_NUMPY)

