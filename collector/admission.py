"""Admission control shared by both receivers: how many requests and how many bytes are in flight.

A request is admitted before its body is read (the count) and again before it is decoded (the bytes:
the body and an estimate of its decoded form). What is refused here gets a retryable refusal with a
delay (UNAVAILABLE + RetryInfo / 503 + Retry-After); nothing admitted is ever dropped. Together with
the batcher's queue cap and DuckDB's memory limit this bounds the collector's memory whatever the
request sizes and the number of senders.
"""

from __future__ import annotations

import threading

from spanrl.collector.errors import RetryableError

__all__ = ["DECODE_FACTOR", "Admission"]

DECODE_FACTOR = 6
"""Bytes held per body byte while a request is decoded: the body itself plus the walk's peak (the
parsed protobuf, Python temporaries, the Arrow columns), measured at 3.7x the body for agent spans
with base64 token ids and 5.0x for 24k spans with a 1.4 kB string attribute each (RSS growth)."""


class _Bytes:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.lock = threading.Lock()


class Admission:
    """Counts requests and bytes in flight; refuses past either cap. Thread-safe.

    `with_request_cap` gives a sibling with its own request cap and the same byte budget (one budget
    for both receivers, a request cap each).
    """

    def __init__(self, *, max_requests: int, max_bytes: int, retry_after_s: int, _shared: _Bytes | None = None) -> None:
        self._max_requests = max_requests
        self._retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._requests = 0
        self._bytes = _shared if _shared is not None else _Bytes(max_bytes)

    def with_request_cap(self, max_requests: int) -> "Admission":
        """A sibling admitting ``max_requests`` at once, sharing this byte budget."""
        return Admission(max_requests=max_requests, max_bytes=self._bytes.limit, retry_after_s=self._retry_after_s, _shared=self._bytes)

    @property
    def retry_after_s(self) -> int:
        """The delay sent with this admission's refusals."""
        return self._retry_after_s

    @property
    def in_flight_bytes(self) -> int:
        """Bytes held now (all siblings)."""
        return self._bytes.held

    def enter(self, what: str) -> None:
        """Admit one more request or raise `RetryableError`; pair with `leave`."""
        with self._lock:
            if self._requests >= self._max_requests:
                raise RetryableError(
                    f"{what}: {self._requests} requests in flight, the limit; retry later", retry_after_s=self._retry_after_s
                )
            self._requests += 1

    def leave(self) -> None:
        """One admitted request is done."""
        with self._lock:
            self._requests -= 1

    def reserve(self, nbytes: int) -> None:
        """Hold ``nbytes`` more or raise `RetryableError`; pair with `release`. When nothing is held, any
        size is admitted, so a request bigger than the whole budget is not refused forever."""
        b = self._bytes
        with b.lock:
            if b.held and b.held + nbytes > b.limit:
                raise RetryableError(
                    f"collector memory budget full ({b.held} of max_inflight_bytes={b.limit} bytes held by "
                    f"requests being decoded); retry later",
                    retry_after_s=self._retry_after_s,
                )
            b.held += nbytes

    def release(self, nbytes: int) -> None:
        """Give back bytes taken with `reserve`."""
        if nbytes:
            with self._bytes.lock:
                self._bytes.held -= nbytes
