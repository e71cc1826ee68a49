"""Admission: what a request may bring in, decided before it is queued. Shared by both receivers.

**Its bytes.** A request is admitted before its body is read (the count) and again before it is decoded (the
bytes: the body and an estimate of its decoded form, body x DECODE_FACTOR). The decoders then count their
output as they produce it (`DecodeBudget`): a request whose decoded form outgrows the estimate (a large
resource repeated in each of its spans' rows) holds more of the budget, is refused as overload while others
hold it, or, when its decoded form needs more than the whole budget, is refused for good
(`PayloadTooLargeError`: 413 / INVALID_ARGUMENT). What is refused for overload gets a retryable refusal with a
delay (UNAVAILABLE + RetryInfo / 503 + Retry-After); nothing admitted is ever dropped. Together with the
batcher's queue cap and DuckDB's memory limit this bounds the collector's memory whatever the request sizes,
shapes and the number of senders.

**What its sender may claim** (`admit`), from the token it presented (docs/architecture.md, "Trust").
Rollouts: the first service (resource ``service.name``) whose spans name a rollout id claims it; spans of
another service naming it are rejected (partial success, with the reason), so one tenant cannot join, or end,
or reward another's rollout by setting ``spanrl.rollout.id``. Not counted as claims, and never refused: the
policy server's spans (its token; with no policy token, SERVER spans with ``gen_ai.operation.name``), and
``spanrl.feedback`` spans (feedback comes from other services by design). Token ids and log-probs on a span are
what training trusts as the policy's own sampling; a response id on a SERVER span is what attributes an
agent's calls (and feedback keyed by response id) to a rollout. Only the policy server makes either: so a
request whose token does not grant the ``policy`` scope has its spans' ``prompt_token_ids``,
``completion_token_ids`` and ``logprobs`` columns, and the ``response_id`` column of its SERVER spans, stored
NULL (the attributes JSON keeps what was sent, for people to read). When no token grants ``policy`` (no
``--token``, no ``--policy-token``) every sender is trusted, as before scopes existed.

**Its rewards** (`check_rewards`): a span whose reward cannot be trained on is rejected alone. One reward of
1e200 passes a float64 finiteness check and overflows float32 in the loss (issue 28); a NaN or an infinity
stops whatever averages it. So every decoded request, from either decoder and either receiver, is checked
before it is queued: a span is rejected (OTLP partial success, with the reason) when

* its typed reward (``spanrl.reward.value`` / ``gen_ai.evaluation.score.value``, the ``reward_value``
  column) is NaN, infinite or outside ``reward_range``;
* a reward event on it (``spanrl.reward`` / ``gen_ai.evaluation.result``) carries a value key whose value
  is not a number, or not finite (JSON has no NaN: the encoders write NaN and infinities as null), or is
  outside ``reward_range``. An evaluation event with only a label and no score is not a reward and passes.

The rest of the request is stored. The readers check again (store/views.sql's ``rollout_rewards``), for
rows stored before this check existed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from spanrl import semconv as sc
from spanrl.collector.encoding import EncodedBatch
from spanrl.collector.errors import PayloadTooLargeError, RetryableError
from spanrl.collector.otlp_json import MAX_ERRORS_REPORTED
from spanrl.trust import Tokens

__all__ = [
    "DECODE_FACTOR", "DEFAULT_REWARD_RANGE", "POLICY_ONLY_COLUMNS", "Admission", "DecodeBudget", "RewardCheck",
    "DERIVED_ROLLOUT_PREFIXES", "RolloutClaims", "admit", "check_rewards", "for_sender", "reward_problem",
]

_logger = logging.getLogger(__name__)


# --- its bytes ------------------------------------------------------------------------------------------
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


# --- what its sender may claim ------------------------------------------------------------------
POLICY_ONLY_COLUMNS = ("prompt_token_ids", "completion_token_ids", "logprobs")
"""Columns stored only from a sender with the ``policy`` scope."""


def admit(
    batch: EncodedBatch, tokens: Tokens, claims: "RolloutClaims | None", authorization: str | None
) -> EncodedBatch:
    """``batch`` as its sender may store it: policy-only columns (`for_sender`), then rollout claims."""
    batch = for_sender(batch, tokens, authorization)
    if claims is None or batch.table is None:
        return batch
    policy_sender = tokens.guarded("policy") and "policy" in tokens.scopes_of(authorization)
    return batch if policy_sender else claims.admit(batch, open_policy=not tokens.guarded("policy"))


def for_sender(batch: EncodedBatch, tokens: Tokens, authorization: str | None) -> EncodedBatch:
    """``batch`` as the sender of ``authorization`` may store it (the same object when it may store all)."""
    table = batch.table
    if table is None or not tokens.guarded("policy") or "policy" in tokens.scopes_of(authorization):
        return batch
    present = table.schema.names
    columns = {name: table.column(name) for name in POLICY_ONLY_COLUMNS if name in present}
    claimed = [name for name, col in columns.items() if col.null_count < len(col)]
    responses = table.column("response_id")
    server = None
    if responses.null_count < len(responses) and "SERVER" in pc.unique(table.column("kind")).to_pylist():
        server = pc.equal(table.column("kind"), "SERVER")
    has_response = server is not None and pc.any(pc.and_(server, pc.is_valid(responses))).as_py()
    if not claimed and not has_response:
        return batch
    for name in claimed:
        table = table.set_column(present.index(name), name, pa.nulls(len(table), columns[name].type))
    if has_response:
        index = present.index("response_id")
        no_id = pc.if_else(server, pa.scalar(None, pa.string()), table.column(index))
        table = table.set_column(index, "response_id", no_id)
    _logger.debug("dropped token ids / server response ids of %d spans from a sender without the policy scope",
                  len(table))
    return EncodedBatch(table, batch.accepted, batch.rejected, batch.error_message)


DERIVED_ROLLOUT_PREFIXES = sc.DERIVED_ROLLOUT_PREFIXES
"""Rollout ids the store derives (store/views.sql, ``trace_rollouts``) for calls the policy server served; the server
binds their conversation and trace to the tenant whose key opened them (serving/tenants.py). A span naming one
(``spanrl.rollout.id``) is refused: an ERROR ``spanrl.rollout`` span could otherwise fail the conversation."""
_IN_FLIGHT_S = 60.0  # a batch admitted this long before a prune has been committed by the time it scans
_CLAIMED_IDS_SQL = "SELECT DISTINCT rollout_id FROM spans WHERE rollout_id IS NOT NULL"

# The spans that neither claim a rollout nor are refused for naming one (see the module docstring).
_UNCLAIMED_SQL = f"""
SELECT rollout_id, arg_min(coalesce(service_name, ''), ingested_ns) AS service
FROM spans
WHERE rollout_id IS NOT NULL AND name <> '{sc.FEEDBACK_SPAN_NAME}'
  AND NOT (kind = 'SERVER' AND (operation_name IS NOT NULL OR completion_token_ids IS NOT NULL))
GROUP BY rollout_id
"""


class RolloutClaims:
    """Which service owns each rollout id: loaded from the store at start, then kept in memory (about 100
    bytes a rollout) as batches are admitted, and forgotten when a prune deletes the rollout. Thread-safe.
    None owns an id of `DERIVED_ROLLOUT_PREFIXES`: a span naming one is refused."""

    def __init__(self, owners: dict[str, str] | None = None) -> None:
        self._owners = dict(owners or {})
        self._named: dict[str, float] = {}  # rollout id -> when a batch last named it (time.monotonic())
        self._lock = threading.Lock()

    @classmethod
    def load(cls, store: Any) -> "RolloutClaims":
        """The claims already in ``store`` (one scan of the spans with a rollout id)."""
        table = store.sql(_UNCLAIMED_SQL)
        return cls(dict(zip(table.column("rollout_id").to_pylist(), table.column("service").to_pylist())))

    def forget_pruned(self, store: Any, started: float) -> int:
        """Forget the claims of rollouts ``store`` no longer holds (a prune deleted them), so memory stays
        bounded by the store. A rollout a batch named within ``_IN_FLIGHT_S`` of ``started`` (the prune's
        ``time.monotonic()``) keeps its claim: its spans may be admitted but not yet committed. Returns how
        many claims were forgotten."""
        present = set(store.sql(_CLAIMED_IDS_SQL).column("rollout_id").to_pylist())
        with self._lock:
            gone = [rid for rid in self._owners
                    if rid not in present and self._named.get(rid, 0.0) < started - _IN_FLIGHT_S]
            for rid in gone:
                del self._owners[rid]
                self._named.pop(rid, None)
        return len(gone)

    def __len__(self) -> int:
        with self._lock:
            return len(self._owners)

    def owner(self, rollout_id: str) -> str | None:
        """The service that claimed ``rollout_id`` ('' for spans without a service name), or None."""
        with self._lock:
            return self._owners.get(rollout_id)

    def admit(self, batch: EncodedBatch, *, open_policy: bool) -> EncodedBatch:
        """``batch`` without the spans that name a rollout another service claimed; new rollouts are claimed.
        ``open_policy``: no token grants the policy scope, so LLM SERVER spans count as the policy server's."""
        table = batch.table
        if table is None:
            return batch
        rollout = table.column("rollout_id")
        if rollout.null_count == len(rollout):
            return batch
        service = table.column("service_name")
        exempt_names = sc.FEEDBACK_SPAN_NAME in pc.unique(table.column("name")).to_pylist()
        exempt_servers = open_policy and "SERVER" in pc.unique(table.column("kind")).to_pylist()
        if exempt_names or exempt_servers:
            checked = pc.and_(pc.is_valid(rollout), pc.not_equal(table.column("name"), sc.FEEDBACK_SPAN_NAME))
            if exempt_servers:
                llm_server = pc.and_(pc.equal(table.column("kind"), "SERVER"),
                                     pc.is_valid(table.column("operation_name")))
                checked = pc.and_(checked, pc.invert(llm_server))
            checked = pc.fill_null(checked, False)
        else:
            checked = None  # every span with a rollout id is checked
        rids = [r for r in pc.unique(rollout).to_pylist() if r is not None]
        svcs = pc.unique(service).to_pylist()
        if checked is None and len(rids) == 1 and len(svcs) == 1:  # the common case: one agent, one rollout
            pairs = [(rids[0], svcs[0] or "")]
        else:
            keep = pc.is_valid(rollout) if checked is None else checked
            pairs_table = pa.table({"r": rollout, "s": pc.fill_null(service, "")})
            chosen = pairs_table.filter(keep).group_by(["r", "s"]).aggregate([])

            pairs = list(zip(chosen.column("r").to_pylist(), chosen.column("s").to_pylist()))
        refused: dict[tuple[str, str], str] = {}
        now = time.monotonic()
        with self._lock:
            for rid, svc in pairs:
                if rid.startswith(DERIVED_ROLLOUT_PREFIXES):  # the store's own ids: no span may claim one
                    refused[(rid, svc)] = ""
                    continue
                self._named[rid] = now
                owner = self._owners.setdefault(rid, svc)
                if owner != svc:
                    refused[(rid, svc)] = owner
        if not refused:
            return batch
        keys = pc.binary_join_element_wise(rollout, pc.fill_null(service, ""), "\x00")
        bad = pc.is_in(keys, pa.array([f"{r}\x00{s}" for r, s in refused]))
        bad = pc.fill_null(bad if checked is None else pc.and_(checked, bad), False)
        kept = table.filter(pc.invert(bad))
        dropped = len(table) - len(kept)
        (rid, svc), owner = next(iter(refused.items()))
        why = (f"a rollout id only the store derives: {rid!r} is the rollout of the policy server's calls that "
               f"opened it, and no span may name it" if rid.startswith(DERIVED_ROLLOUT_PREFIXES) else
               f"a rollout another service claimed: rollout {rid!r} belongs to service {owner!r}, not {svc!r}")
        reason = f"{dropped} spans name {why}" + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else "")
        message = "; ".join(m for m in (batch.error_message, reason) if m)
        return EncodedBatch(kept if len(kept) else None, batch.accepted - dropped, batch.rejected + dropped, message)


# --- its rewards ----------------------------------------------------------------------------------
DEFAULT_REWARD_RANGE = (-sc.REWARD_ABS_MAX, sc.REWARD_ABS_MAX)
_EVENT_NAMES = (sc.REWARD_SPAN_NAME, sc.GEN_AI_EVALUATION_RESULT_EVENT)
_EVENT_KEYS = (sc.REWARD_VALUE, sc.GEN_AI_EVALUATION_SCORE_VALUE)


def reward_problem(value: Any, low: float, high: float) -> str | None:
    """Why ``value`` is not a usable reward (None when it is): a finite number in ``[low, high]``."""
    if isinstance(value, bool) or value is None:
        got = "null (NaN or an infinity)" if value is None else repr(value)
        return f"must be a finite number in [{low:g}, {high:g}], got {got}"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return f"must be a finite number in [{low:g}, {high:g}], got {value!r}"
    if not math.isfinite(number) or not low <= number <= high:
        return f"must be a finite number in [{low:g}, {high:g}], got {number!r}"
    return None


def _event_problem(events_json: str, low: float, high: float) -> str | None:
    try:
        events = orjson.loads(events_json)
    except orjson.JSONDecodeError:  # never expected: the encoders wrote it
        return None
    for event in events if isinstance(events, list) else ():
        if not isinstance(event, dict) or event.get("name") not in _EVENT_NAMES:
            continue
        attributes = event.get("attributes") or {}
        for key in _EVENT_KEYS:
            if key in attributes:
                problem = reward_problem(attributes[key], low, high)
                if problem is not None:
                    return f"event {event['name']!r}: {key} {problem}"
    return None


def _float64_column(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, present) of a float64 column, read from its buffers: pyarrow's ``to_numpy`` imports pandas
    on first use (0.5 s on the HTTP receiver's event loop) and ``fill_null`` took ~7 ms a batch."""
    values, present = [], []
    for chunk in column.chunks:
        n, offset = len(chunk), chunk.offset
        validity, data = chunk.buffers()
        values.append(np.frombuffer(data, dtype=np.float64, count=n, offset=offset * 8))
        if validity is None:
            present.append(np.ones(n, dtype=bool))
        else:
            bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
            present.append(bits[offset : offset + n].astype(bool))
    return np.concatenate(values), np.concatenate(present)


def check_rewards(batch: EncodedBatch, low: float, high: float) -> EncodedBatch:
    """Drop the spans of ``batch`` whose reward is unusable (see the module docstring), in place: its
    table, ``accepted``, ``rejected`` and ``error_message`` (the first reasons, as the decoders word
    them). Returns the batch. Cheap when no span carries a reward (two vectorised scans)."""
    table = batch.table
    if table is None or table.num_rows == 0:
        return batch
    problems: dict[int, str] = {}
    values = table.column("reward_value")
    if values.null_count < len(values):
        numbers, present = _float64_column(values)
        with np.errstate(invalid="ignore"):
            bad = present & ~(np.isfinite(numbers) & (numbers >= low) & (numbers <= high))
        for row in np.flatnonzero(bad).tolist():
            problems[row] = f"reward {reward_problem(values[row].as_py(), low, high)}"
    events = table.column("events")
    if events.null_count < len(events):
        hits = pc.or_(pc.match_substring(events, _EVENT_NAMES[0]), pc.match_substring(events, _EVENT_NAMES[1]))
        rows = pc.indices_nonzero(pc.fill_null(hits, False))
        for row, text in zip(rows.to_pylist(), events.take(rows).to_pylist()):
            if row not in problems:
                problem = _event_problem(text, low, high)
                if problem is not None:
                    problems[row] = problem
    if not problems:
        return batch
    span_ids, names = table.column("span_id"), table.column("name")
    reasons = [f"span {span_ids[r].as_py()} ({names[r].as_py()!r}): {problems[r]}" for r in sorted(problems)]
    keep = pa.array([r not in problems for r in range(table.num_rows)])
    kept = table.filter(keep)
    earlier = batch.error_message.partition(" rejected: ")[2]  # "N span(s) rejected: reason; reason"
    shown = ([earlier] if earlier else []) + reasons[: max(MAX_ERRORS_REPORTED - (1 if earlier else 0), 1)]
    total = batch.rejected + len(problems)
    more = len(problems) - (len(shown) - (1 if earlier else 0))
    batch.table = kept if kept.num_rows else None
    batch.accepted = kept.num_rows
    batch.rejected = total
    batch.error_message = f"{total} span(s) rejected: {'; '.join(shown)}" + (f" (and {more} more)" if more > 0 else "")
    return batch


class RewardCheck:
    """Between the receivers and the batcher: `check_rewards` on every batch, then ``next_consumer``.

    ``consume`` changes the batch in place (the receivers read its ``rejected`` and ``error_message``
    for their reply after the call) and does not keep it; the batcher does."""

    def __init__(self, reward_range: tuple[float, float], next_consumer: Any) -> None:
        self.low, self.high = float(reward_range[0]), float(reward_range[1])
        self._next = next_consumer

    def consume(self, batch: EncodedBatch) -> "Future[int]":
        return self._next.consume(check_rewards(batch, self.low, self.high))
