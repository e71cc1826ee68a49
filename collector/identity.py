"""What a sender may claim, decided once at ingest from the token it presented (docs/architecture.md, "Trust").

Rollouts: the first service (resource ``service.name``) whose spans name a rollout id claims it; spans of
another service naming it are rejected (partial success, with the reason), so one tenant cannot join, or
end, or reward another's rollout by setting ``spanrl.rollout.id``. Not counted as claims, and never refused:
the policy server's spans (its token; with no policy token, SERVER spans with ``gen_ai.operation.name``),
and ``spanrl.feedback`` spans (feedback comes from other services by design).

Token ids and log-probs on a span are what training trusts as the policy's own sampling; a response id on a
SERVER span is what attributes an agent's calls (and feedback keyed by response id) to a rollout. Only the
policy server makes either: so a request whose token does not grant the ``policy`` scope has its spans'
``prompt_token_ids``, ``completion_token_ids`` and ``logprobs`` columns, and the ``response_id`` column of its
SERVER spans, stored NULL (the attributes JSON keeps what was sent, for people to read). When no token grants
``policy`` (no ``--token``, no ``--policy-token``) every sender is trusted, as before scopes existed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spanrl import semconv
from spanrl.collector.encoding import EncodedBatch
from spanrl.trust import Tokens

__all__ = ["POLICY_ONLY_COLUMNS", "RolloutClaims", "admit", "for_sender"]

_logger = logging.getLogger(__name__)

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


_IN_FLIGHT_S = 60.0  # a batch admitted this long before a prune has been committed by the time it scans
_CLAIMED_IDS_SQL = "SELECT DISTINCT rollout_id FROM spans WHERE rollout_id IS NOT NULL"

# The spans that neither claim a rollout nor are refused for naming one (see the module docstring).
_UNCLAIMED_SQL = f"""
SELECT rollout_id, arg_min(coalesce(service_name, ''), ingested_ns) AS service
FROM spans
WHERE rollout_id IS NOT NULL AND name <> '{semconv.FEEDBACK_SPAN_NAME}'
  AND NOT (kind = 'SERVER' AND (operation_name IS NOT NULL OR completion_token_ids IS NOT NULL))
GROUP BY rollout_id
"""


class RolloutClaims:
    """Which service owns each rollout id: loaded from the store at start, then kept in memory (about 100
    bytes a rollout) as batches are admitted, and forgotten when a prune deletes the rollout. Thread-safe."""

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
        exempt_names = semconv.FEEDBACK_SPAN_NAME in pc.unique(table.column("name")).to_pylist()
        exempt_servers = open_policy and "SERVER" in pc.unique(table.column("kind")).to_pylist()
        if exempt_names or exempt_servers:
            checked = pc.and_(pc.is_valid(rollout), pc.not_equal(table.column("name"), semconv.FEEDBACK_SPAN_NAME))
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
        reason = (f"{dropped} spans name a rollout another service claimed: rollout {rid!r} belongs to service "
                  f"{owner!r}, not {svc!r}" + (f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""))
        message = "; ".join(m for m in (batch.error_message, reason) if m)
        return EncodedBatch(kept if len(kept) else None, batch.accepted - dropped, batch.rejected + dropped, message)
