"""A damaged store or a full disk at start is a clear error, never a collector that half works (issue 28 item 9).

A truncated DuckDB file opened with /health "ok", acknowledged writes that lived only in the WAL, and
failed every checkpoint; a restart on a full disk died with a raw TransactionException traceback.
Real DuckDB files, real `spanrl collector` processes; a full disk is RLIMIT_FSIZE (EFBIG on any write).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from _otlp import make_request
from spanrl.collector import Collector, CollectorConfig
from spanrl.collector.encoding import encode_request
from spanrl.errors import StoreError
from spanrl.store import SpanStore

_SPANS = 20_000


def _store_with_spans(path: Path) -> int:
    store = SpanStore.open(path)
    for _ in range(_SPANS // 2_000):
        store.append(encode_request(make_request(2_000, attributes={"blob": "x" * 200})[0]).table)
    store.close()  # checkpointed: everything is in the file, no WAL
    return path.stat().st_size


def _collector_cli(db: Path, cwd: Path, *, file_size_limit: int | None = None) -> subprocess.CompletedProcess[str]:
    def preexec() -> None:
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, resource.RLIM_INFINITY))

    cmd = [sys.executable, "-m", "spanrl", "collector", "--db", str(db), "--grpc-port", "0", "--http-port", "0"]
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if line.startswith("spanrl collector ready"):
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, line + out, err)


def test_a_truncated_store_is_refused_at_start_with_the_reason(tmp_path):
    db = tmp_path / "spans.duckdb"
    size = _store_with_spans(db)
    os.truncate(db, size // 2)
    collector = Collector(CollectorConfig(db_path=str(db), grpc_port=0, http_port=0))
    with pytest.raises(StoreError, match=r"is damaged: the file has \d+ bytes, its header names \d+ blocks"):
        collector.start()
    health = collector.health()
    assert health["status"] == "failed" and "truncated or only partly copied" in health["error"]
    assert collector.failed.is_set()

    ran = _collector_cli(db, tmp_path)
    assert ran.returncode == 1 and "ready" not in ran.stdout
    assert "spanrl: error: " in ran.stderr and "is damaged" in ran.stderr and "Traceback" not in ran.stderr
    assert db.stat().st_size == size // 2 and not Path(f"{db}.wal").exists()  # nothing written to it


@pytest.mark.parametrize("offset", [0, 3 * 4096], ids=["header", "first-block"])
def test_a_store_with_damaged_bytes_is_refused_at_start_with_the_reason(tmp_path, offset):
    """DuckDB checksums every block; a damaged one read at start (the header, the catalog's) is named, not
    a bare 'SQL failed' or a traceback, and the file is left as it was."""
    db = tmp_path / "spans.duckdb"
    _store_with_spans(db)
    with open(db, "r+b") as f:
        f.seek(offset)
        f.write(bytes(range(256)) * 16)  # 4 KiB that are no DuckDB block
    damaged = db.read_bytes()
    ran = _collector_cli(db, tmp_path)
    assert ran.returncode == 1 and "ready" not in ran.stdout and "Traceback" not in ran.stderr, ran.stderr
    assert f"the span store '{db}' is damaged: " in ran.stderr and "Restore it from a backup" in ran.stderr
    assert db.read_bytes() == damaged


def test_a_full_disk_at_restart_is_a_clear_error_and_loses_nothing(tmp_path):
    db = tmp_path / "spans.duckdb"
    _store_with_spans(db)
    ran = _collector_cli(db, tmp_path, file_size_limit=1)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr
    assert "the disk is full (or a file size limit was reached)" in ran.stderr and "free some space" in ran.stderr
    ran = _collector_cli(db, tmp_path)  # space again: it starts on the same file, every span there
    assert ran.returncode == 0 and ran.stdout.startswith("spanrl collector ready"), ran.stderr
    with SpanStore.open(db, read_only=True) as store:
        assert store.span_count() == _SPANS
