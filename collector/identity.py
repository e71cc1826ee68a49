"""What a sender may claim, decided once at ingest from the token it presented (docs/architecture.md, "Trust").

Token ids and log-probs on a span are what training trusts as the policy's own sampling; a response id on a
SERVER span is what attributes an agent's calls (and feedback keyed by response id) to a rollout. Only the
policy server makes either: so a request whose token does not grant the ``policy`` scope has its spans'
``prompt_token_ids``, ``completion_token_ids`` and ``logprobs`` columns, and the ``response_id`` column of its
SERVER spans, stored NULL (the attributes JSON keeps what was sent, for people to read). When no token grants
``policy`` (no ``--token``, no ``--policy-token``) every sender is trusted, as before scopes existed.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from spanrl.collector.encoding import EncodedBatch
from spanrl.trust import Tokens

__all__ = ["POLICY_ONLY_COLUMNS", "for_sender"]

_logger = logging.getLogger(__name__)

POLICY_ONLY_COLUMNS = ("prompt_token_ids", "completion_token_ids", "logprobs")
"""Columns stored only from a sender with the ``policy`` scope."""


def for_sender(batch: EncodedBatch, tokens: Tokens, authorization: str | None) -> EncodedBatch:
    """``batch`` as the sender of ``authorization`` may store it (the same object when it may store all)."""
    table = batch.table
    if table is None or not tokens.guarded("policy") or "policy" in tokens.scopes_of(authorization):
        return batch
    columns = {name: table.column(name) for name in POLICY_ONLY_COLUMNS if name in table.column_names}
    claimed = [name for name, col in columns.items() if col.null_count < len(col)]
    server = pc.equal(table.column("kind"), "SERVER") if "response_id" in table.column_names else None
    has_response = server is not None and pc.any(pc.and_(server, pc.is_valid(table.column("response_id")))).as_py()
    if not claimed and not has_response:
        return batch
    for name in claimed:
        table = table.set_column(table.column_names.index(name), name, pa.nulls(len(table), columns[name].type))
    if has_response:
        index = table.column_names.index("response_id")
        table = table.set_column(index, "response_id", pc.if_else(server, pa.scalar(None, pa.string()), table.column(index)))
    _logger.debug("dropped token ids / server response ids of %d spans from a sender without the policy scope", len(table))
    return EncodedBatch(table, batch.accepted, batch.rejected, batch.error_message)
