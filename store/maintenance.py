"""Parquet export and retention (prune) of the span store."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pyarrow.parquet as pq

from spanrl.errors import ConfigError
from spanrl.store._spanstore import SpanStore
from spanrl.store.remote import RemoteStore

__all__ = ["EXPORT_TABLES", "export_parquet", "parse_duration_s", "prune"]

EXPORT_TABLES = ("spans", "rollouts", "llm_calls", "rewards")
"""What `export_parquet` writes by default: the table and the three views, one Parquet file each."""

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_NS_PER_S = 1_000_000_000
_MAX_OLDER_THAN_S = (2**63 - 1) // _NS_PER_S  # ~292 years: the cutoff is an int64 of nanoseconds


def parse_duration_s(text: str) -> float:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` -> seconds. `ConfigError` names the bad value."""
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"older_than must be a number and a unit s/m/h/d/w (e.g. 7d), got {text!r}")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def export_parquet(
    source: SpanStore | RemoteStore, out_dir: str | Path, *, tables: tuple[str, ...] = EXPORT_TABLES
) -> list[Path]:

    """Write each of ``tables`` to ``out_dir/<name>.parquet``; return the paths written.

    A local store streams with DuckDB's COPY; a remote one (a running collector) is fetched as Arrow.
    """
    for name in tables:
        if name not in EXPORT_TABLES:
            raise ConfigError(f"tables must be among {', '.join(EXPORT_TABLES)}, got {name!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in tables:
        path = out / f"{name}.parquet"
        if isinstance(source, SpanStore):
            escaped = str(path).replace("'", "''")
            source.sql(f"COPY (SELECT * FROM {name}) TO '{escaped}' (FORMAT parquet, COMPRESSION zstd)")
        else:
            pq.write_table(source.sql(f"SELECT * FROM {name}"), path, compression="zstd")
        written.append(path)
    return written


# By ingest time (the collector's clock): a sender's end_ns can be anything, and one stamped in the
# future would never be pruned.
_PRUNE_WHERE = """
    ingested_ns < $cutoff AND (
        rollout_id IS NULL
        OR rollout_id IN (SELECT rollout_id FROM spans WHERE rollout_id IS NOT NULL
                          GROUP BY rollout_id HAVING max(ingested_ns) < $cutoff))
"""


def prune(store: SpanStore, older_than_s: float, *, now_ns: int | None = None) -> int:
    """Delete whole rollouts whose last span was ingested over ``older_than_s`` ago, and rollout-less
    spans ingested before then; never part of a rollout (``ingested_ns``: the collector's clock, never the
    sender's ``end_ns``). Returns the number of spans deleted. The kept
    decomposition of every rollout sharing a trace with a deleted span goes in the same transaction."""
    if not 0 <= older_than_s <= _MAX_OLDER_THAN_S:  # also refuses NaN
        raise ConfigError(f"older_than must be from 0 to {_MAX_OLDER_THAN_S} seconds (292 years), got {older_than_s}")
    now = time.time_ns() if now_ns is None else now_ns
    cutoff = now - int(older_than_s * _NS_PER_S)
    cur = store.cursor()
    try:
        cur.begin()
        n = cur.execute(f"SELECT count(*) FROM spans WHERE {_PRUNE_WHERE}", {"cutoff": cutoff}).fetchone()[0]
        # kept decompositions (store/kept_rollouts.py) of every rollout with a span in a trace it prunes
        # (and the notes of where the open ones start: reads go live until the next run)
        cur.execute(f"DELETE FROM decomposed WHERE row_kind = 'open' OR rollout_id IN (SELECT rollout_id FROM "
                    f"rollout_spans(0) WHERE trace_id IN (SELECT trace_id FROM spans WHERE {_PRUNE_WHERE}))",
                    {"cutoff": cutoff})
        cur.execute(f"DELETE FROM spans WHERE {_PRUNE_WHERE}", {"cutoff": cutoff})
        cur.commit()
    finally:
        cur.close()
    return int(n)
