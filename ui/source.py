"""Where the viewer reads spans: a running collector (its read-only SQL endpoint) or a DuckDB file
opened read-only and sandboxed like the collector's store (no other file, no URL, settings locked). Both
answer ``sql(query, params) -> pyarrow.Table``."""


from __future__ import annotations

import os
from typing import Any, Sequence

import pyarrow as pa

from spanrl.errors import StoreError, StoreUnavailableError
from spanrl.store import RemoteStore, SpanStore

__all__ = ["Source", "open_source"]


class Source:
    """Read-only SQL over the span store, from many threads (one cursor per call on a file)."""

    def __init__(self, backend: RemoteStore | SpanStore, description: str, db_path: str | None) -> None:
        self._backend = backend
        self.description = description
        """What is being read, for the page header: the collector's URL or the file's path."""
        self.db_path = db_path
        """The DuckDB file behind it (the collector's, as its /health says), when known."""

    @property
    def remote(self) -> bool:
        """Whether reads go through a collector."""
        return isinstance(self._backend, RemoteStore)

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pa.Table:
        """Run one read statement; anything else is refused (by the collector, or by `SpanStore.read_sql`)."""
        return self._backend.sql(query, params) if self.remote else self._backend.read_sql(query, params)

    def close(self) -> None:
        if isinstance(self._backend, SpanStore):
            self._backend.close()


def open_source(*, db: str | None, url: str | None, token: str | None, default_db: str | None = None) -> Source:
    """The collector at ``url`` when it answers (and serves ``db``, when given), else the file ``db``
    (or ``default_db`` when no ``db`` was named).

    Raises `StoreError` when neither can be read: no collector and no file, or a file held by a
    process that answers no SQL (`spanrl.errors.StoreBusyError`).
    """
    if url:
        remote = RemoteStore(url, token=token)
        health = remote.health()
        if health is not None:
            served = health.get("db")
            if db is None or not served or os.path.abspath(served) == os.path.abspath(db):
                return Source(remote, f"collector {remote.url} ({served or 'its store'})", served)
    db = db or default_db
    if db is None:
        raise StoreUnavailableError(f"no collector answered at {url} and no --db file was given")
    if not os.path.exists(db):
        where = f"no collector answered at {url} and " if url else ""
        raise StoreError(f"{where}no span store at {db!r}: the file does not exist")
    # sandboxed as the collector's SQL endpoint is: the SQL box reads no file but the store, fetches no URL
    store = SpanStore.open(db, read_only=True, sandboxed=True)
    return Source(store, f"file {os.path.abspath(db)} (read-only)", os.path.abspath(db))
