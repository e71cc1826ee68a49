"""What a DuckDB error means. DuckDB raises the same few exception types for very different troubles, so some
are told apart by their message text: that reading lives here, once, for the store's open and read paths
(`store._spanstore`) and the collector's writer (`collector.batcher`)."""

from __future__ import annotations

import duckdb

__all__ = ["damaged", "disk_full", "invalidated", "locked"]

_LOCKED = ("Could not set lock on file",)
_DAMAGED = ("Corrupt database file", "is not a valid DuckDB database file")  # its block checksums, its header
_DISK_FULL = ("No space left", "File too large", "Disk full", "disk is full")
_INVALIDATED = ("database has been invalidated",)
# after these DuckDB refuses every statement until the database is opened again
_FATAL_TYPES = (duckdb.FatalException, duckdb.InternalException)


def _says(exc: BaseException, needles: tuple[str, ...]) -> bool:
    text = str(exc)
    return any(needle in text for needle in needles)


def locked(exc: BaseException) -> bool:
    """Another process holds the database file."""
    return _says(exc, _LOCKED)


def damaged(exc: BaseException) -> bool:
    """A block whose checksum fails, or a header DuckDB cannot read."""
    return _says(exc, _DAMAGED)


def disk_full(exc: BaseException) -> bool:
    """The disk is full, or a file size limit was reached."""
    return _says(exc, _DISK_FULL)


def invalidated(exc: BaseException) -> bool:
    """DuckDB refuses every statement on this connection until the database is opened again."""
    return isinstance(exc, _FATAL_TYPES) or _says(exc, _INVALIDATED)
