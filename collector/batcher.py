"""Group commit: a bounded queue of encoded requests drained by one writer thread.

Receivers call `Batcher.consume(batch)` and get a future that resolves once the batch's spans are
committed (the receiver acknowledges only then). The writer thread takes every queued request (up to
``max_batch_spans``) into one transaction, commits, then resolves all their futures: under load, many
requests share one disk commit. When the queued bytes would pass ``max_queue_bytes`` the request is
refused with `RetryableError` (UNAVAILABLE / 503 + Retry-After): memory stays bounded and nothing
accepted is ever dropped. Bytes count from queueing until their commit ends; a request larger than the
whole limit is still taken when nothing else is queued, so it cannot be refused forever.
"""

from __future__ import annotations

import collections
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from spanrl.collector.encoding import EncodedBatch
from spanrl.collector.errors import RetryableError
from spanrl.errors import ConfigError

__all__ = ["Batcher", "BatcherConfig", "TableConsumer"]

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
        size = batch.nbytes
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
