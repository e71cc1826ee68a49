"""Admission of a request's bytes, decided before it is decoded; shared by both receivers. It is the one
check that runs on a request rather than on its decoded spans: the two others are stages between the receivers
and the batcher, each run once on every decoded batch (`collector.sender.SenderCheck`, then
`collector.rewards.RewardCheck`, wired in `collector.server`).

A request is admitted before its body is read (the count) and again before it is decoded (the
bytes: the body and an estimate of its decoded form, body x DECODE_FACTOR). The decoders then count their
output as they produce it (`DecodeBudget`): a request whose decoded form outgrows the estimate (a large
resource repeated in each of its spans' rows) holds more of the budget, is refused as overload while others
hold it, or, when its decoded form needs more than the whole budget, is refused for good
(`PayloadTooLargeError`: 413 / INVALID_ARGUMENT). What is refused for overload gets a retryable refusal with a
delay (UNAVAILABLE + RetryInfo / 503 + Retry-After); nothing admitted is ever dropped. Together with the
batcher's queue cap and DuckDB's memory limit this bounds the collector's memory whatever the request sizes,
shapes and the number of senders.
"""

from __future__ import annotations

import threading

from spanrl.collector.errors import PayloadTooLargeError, RetryableError

__all__ = ["DECODE_FACTOR", "Admission", "DecodeBudget"]


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
        return Admission(
            max_requests=max_requests, max_bytes=self._bytes.limit, retry_after_s=self._retry_after_s,
            _shared=self._bytes,

        )

    @property
    def retry_after_s(self) -> int:
        """The delay sent with this admission's refusals."""
        return self._retry_after_s

    @property
    def max_bytes(self) -> int:
        """The byte budget (all siblings)."""
        return self._bytes.limit

    @property
    def in_flight_bytes(self) -> int:
        """Bytes held now (all siblings)."""
        return self._bytes.held

    def enter(self, what: str) -> None:
        """Admit one more request or raise `RetryableError`; pair with `leave`."""
        with self._lock:
            if self._requests >= self._max_requests:
                raise RetryableError(
                    f"{what}: {self._requests} requests in flight, the limit; retry later",
                    retry_after_s=self._retry_after_s,

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


_MIN_GROWTH = 1 << 20  # a decode that outgrows its allowance asks for at least this much more


class DecodeBudget:
    """One request's bytes in an `Admission`'s budget: what the receiver holds for its body (`hold`, body x
    DECODE_FACTOR), then more as the decoders produce its decoded form. A decoder gets
    `output_allowance` (the bytes held beyond the body, ``body_bytes``) and counts its output against it
    as it is produced; past it, `grow_output` holds more or raises: `RetryableError` while other requests
    hold the budget (overload: retry later), `PayloadTooLargeError` when the decoded form needs more than
    the whole budget (max_inflight_bytes, or this request's own body reservation if larger), which no
    retry can change. `release` gives everything back. One request's, used by one thread at a time.
    """

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.held = 0
        """Bytes held now."""
        self.body_bytes = 0
        """The body being decoded (set by the receiver before it decodes)."""

    def hold(self, nbytes: int) -> None:
        """Hold ``nbytes`` more (`Admission.reserve`: RetryableError when the budget is full)."""
        self._admission.reserve(nbytes)
        self.held += nbytes

    def hold_total(self, nbytes: int) -> None:
        """Hold at least ``nbytes`` in all."""
        if nbytes > self.held:
            self.hold(nbytes - self.held)

    def release(self) -> None:
        """Give back everything held (the batch is queued, or the request is done)."""
        self._admission.release(self.held)
        self.held = 0

    def output_allowance(self) -> int:
        """Bytes the decoded form may take now."""
        return max(0, self.held - self.body_bytes)

    def grow_output(self, needed: int) -> int:
        """The decoded form needs ``needed`` bytes, more than allowed: hold enough for it (and, so that a
        growing decode asks a few times only, for up to twice the allowance), and return the new allowance."""
        needed = max(needed, self.output_allowance() + 1)
        ceiling = max(self._admission.max_bytes, self.held)
        if self.body_bytes + needed > ceiling:
            raise PayloadTooLargeError(
                f"the request's decoded spans need more than {ceiling - self.body_bytes} bytes "
                f"(max_inflight_bytes={self._admission.max_bytes}, a {self.body_bytes}-byte body): they could "
                f"never be admitted; send fewer spans per request (or a smaller resource), or raise max_inflight_bytes"
            )
        allowance = self.output_allowance()
        want = min(ceiling - self.body_bytes, max(needed, 2 * allowance, allowance + _MIN_GROWTH))
        try:
            self.hold_total(self.body_bytes + want)
        except RetryableError:
            self.hold_total(self.body_bytes + needed)  # no room for the headroom: just what it needs, else overload
        return self.output_allowance()
