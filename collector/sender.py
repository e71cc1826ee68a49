"""What a request's sender may store, a stage between the receivers and the batcher (`SenderCheck`).

**What its sender may claim**, from the token it presented (docs/architecture.md, "Trust").
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
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spanrl import semconv as sc
from spanrl.collector.encoding import EncodedBatch
from spanrl.trust import Tokens

__all__ = ["DERIVED_ROLLOUT_PREFIXES", "POLICY_ONLY_COLUMNS", "RolloutClaims", "SenderCheck", "for_sender"]

_logger = logging.getLogger(__name__)

POLICY_ONLY_COLUMNS = ("prompt_token_ids", "completion_token_ids", "logprobs")
"""Columns stored only from a sender with the ``policy`` scope."""


class SenderCheck:
    """Between the receivers and the reward check: what the sender of each batch may store (`for_sender`, then
    the rollout claims), then ``next_consumer``. The sender is ``batch.sender_scopes``, the scopes of the token
    it presented (the receiver sets them). Like `RewardCheck`, ``consume`` changes the batch in place (the
    receivers read its ``rejected`` and ``error_message`` for their reply) and does not keep it."""

    def __init__(self, tokens: Tokens, claims: "RolloutClaims | None", next_consumer: Any) -> None:
        self._tokens = tokens
        self._claims = claims
        self._next = next_consumer

    def consume(self, batch: EncodedBatch) -> "Future[int]":
        for_sender(batch, self._tokens)
        guarded = self._tokens.guarded("policy")
        if self._claims is not None and not (guarded and "policy" in batch.sender_scopes):
            self._claims.admit(batch, open_policy=not guarded)
        return self._next.consume(batch)


def for_sender(batch: EncodedBatch, tokens: Tokens) -> EncodedBatch:
    """``batch`` as its sender (``batch.sender_scopes``) may store it: the policy-only columns, and the response
    ids of SERVER spans, NULL unless the sender may speak as the policy server. In place; returns the batch."""
    table = batch.table
    if table is None or not tokens.guarded("policy") or "policy" in batch.sender_scopes:
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
    batch.table = table
    return batch


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
        """``batch`` without the spans that name a rollout another service claimed (in place; returns the
        batch); new rollouts are claimed. ``open_policy``: no token grants the policy scope, so LLM SERVER spans
        count as the policy server's."""
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
        batch.error_message = "; ".join(m for m in (batch.error_message, reason) if m)
        batch.table = kept if len(kept) else None
        batch.accepted -= dropped
        batch.rejected += dropped
        return batch


