"""Rollout completion and outcomes, read from the span store by views.sql's one status rule.

A rollout is *complete* once its end is stored (``rollout_state``'s ``ended_by``): its ``spanrl.rollout``
span, or a ``spanrl.rollout.end`` span that the Trainer writes with `record_end` when it knows the
rollout is over (its command-line agent exited after flushing, a jsonl worker answered done, it timed
out, or the Trainer says so). The Trainer asks `ready` which rollouts are complete and rewarded, and
`final_rewards` what they scored; curricula read `finished_rewards`.

Callers flush in-process spans before asking (see ``RolloutRunner``'s ``flush``): a span still in a
batch processor is not in the store.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from spanrl import semconv
from spanrl.errors import one_of
from spanrl.store.sources import SqlSource

__all__ = ["END_REASONS", "final_rewards", "finished_rewards", "ready", "record_end", "record_ends"]

END_REASONS = ("agent_exit", "agent_done", "timeout", "crashed", "trainer")
"""Why the Trainer stored a rollout's end: its process exited 0 / a jsonl worker answered done / it ran
past its timeout / its process exited non-zero (or the worker answered an error) / the Trainer decided."""
_FAILED_REASONS = frozenset({"timeout", "crashed"})
_TRAINER_SERVICE = "spanrl-trainer"


def record_end(
    store: Any,
    rollout_id: str,
    reason: str,
    *,
    error: str | None = None,
    task_id: str | None = None,
    attempt: int | None = None,
    mode: str | None = None,
) -> None:
    """Store the end of ``rollout_id``: one ``spanrl.rollout.end`` span (status ERROR for ``timeout`` and
    ``crashed``), appended to ``store`` (a writable ``SpanStore``) in its own transaction."""
    record_ends(store, [{"rollout_id": rollout_id, "reason": reason, "error": error, "task_id": task_id,
                         "attempt": attempt, "mode": mode}])


def record_ends(store: Any, ends: Sequence[Mapping[str, Any]]) -> None:
    """Store many ends (each `record_end`'s arguments as a mapping) in one transaction: a commit costs ~3 ms of
    CPU whatever it holds, and the runner hands over the ends of the rollouts that finished since its last poll."""
    rows = [_end_row(**end) for end in ends]
    if rows:
        store.append(pa.Table.from_pylist(rows, schema=_END_SCHEMA))


_END_SCHEMA = pa.schema([
    ("trace_id", pa.string()), ("span_id", pa.string()), ("name", pa.string()), ("kind", pa.string()),
    ("start_ns", pa.int64()), ("end_ns", pa.int64()), ("status_code", pa.string()),
    ("status_message", pa.string()), ("service_name", pa.string()), ("rollout_id", pa.string()),
    ("task_id", pa.string()), ("attempt", pa.int32()), ("mode", pa.string()), ("attributes", pa.string()),
])


def _end_row(rollout_id: str, reason: str, *, error: str | None = None, task_id: str | None = None,
             attempt: int | None = None, mode: str | None = None) -> dict[str, Any]:
    one_of("reason", reason, END_REASONS)
    now = time.time_ns()
    failed = reason in _FAILED_REASONS
    attributes = {semconv.ROLLOUT_ID: rollout_id, semconv.ROLLOUT_END_REASON: reason}
    return {
        "trace_id": os.urandom(16).hex(),
        "span_id": os.urandom(8).hex(),
        "name": semconv.ROLLOUT_END_SPAN_NAME,
        "kind": "INTERNAL",
        "start_ns": now,
        "end_ns": now,
        "status_code": "ERROR" if failed else "OK",
        "status_message": error if failed else None,
        "service_name": _TRAINER_SERVICE,
        "rollout_id": rollout_id,
        "task_id": task_id,
        "attempt": attempt,
        "mode": mode,
        "attributes": json.dumps(attributes),
    }


def ready(store: SqlSource, rollout_ids: Sequence[str], since_ns: int, *, need_token_ids: bool) -> set[str]:
    """The rollouts among ``rollout_ids`` that are complete (end stored, not merely quiet), rewarded and,
    when ``need_token_ids``, hold a policy-server span with token ids. Reads only spans ingested at or
    after ``since_ns`` (the start of this batch of rollouts, less clock-skew margin)."""
    if not rollout_ids:
        return set()
    rows = store.sql(
        "SELECT rollout_id, has_token_ids FROM rollout_state(?) "
        "WHERE list_contains(?, rollout_id) AND end_ingested_ns IS NOT NULL AND rewarded",
        [int(since_ns), list(rollout_ids)],
    ).to_pylist()
    return {r["rollout_id"] for r in rows if r["has_token_ids"] or not need_token_ids}


def final_rewards(store: SqlSource, rollout_ids: Sequence[str]) -> dict[str, float | None]:
    """Each rollout's final reward (its last by time, any name; None without one), by the ``rollouts`` view."""
    if not rollout_ids:
        return {}
    table = store.sql(
        "SELECT rollout_id, final_reward FROM rollouts WHERE list_contains(?, rollout_id)", [list(rollout_ids)]
    )
    return dict(zip(table.column("rollout_id").to_pylist(), table.column("final_reward").to_pylist()))


def finished_rewards(store: SqlSource, *, mode: str, since_ns: int) -> list[dict[str, Any]]:
    """``{"task_id", "final_reward"}`` of every ended (finished or failed) rollout of ``mode`` that started
    at or after ``since_ns`` and has a reward, oldest first."""
    return store.sql(
        "SELECT task_id, final_reward FROM rollouts WHERE mode = ? AND start_ns >= ? AND status <> 'open' "
        "AND final_reward IS NOT NULL ORDER BY start_ns",
        [mode, int(since_ns)],
    ).to_pylist()
