"""`spanrl sql` and `spanrl store export|prune`, through a running collector and on the file."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import urllib.request

import pyarrow.parquet as pq

from _otlp import make_request


def _spanrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spanrl", *args], capture_output=True, text=True, timeout=120)


def _send(proc, n: int, rollout_id: str) -> None:
    body = make_request(n, rollout_id=rollout_id, attributes={"tokens": [1, 2]})[0].SerializeToString()
    req = urllib.request.Request(f"{proc.http_endpoint}/v1/traces", data=body,
                                 headers={"content-type": "application/x-protobuf"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def test_sql_formats_through_running_collector(collector_proc, tmp_path):
    _send(collector_proc, 3, "fmt")
    where = ["--url", collector_proc.http_endpoint, "--db", str(collector_proc.db_path)]
    query = "SELECT rollout_id, count(*) AS n, list(span_id ORDER BY span_id)[1:1] AS first FROM spans GROUP BY ALL"
    table = _spanrl("sql", query, *where)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert (lines[0].split(" | ")[:2] == ["rollout_id", "n"] and lines[2].startswith("fmt        | 3")
            and lines[-1] == "(1 row)")
    rows = list(csv.reader(io.StringIO(_spanrl("sql", query, *where, "--format", "csv").stdout)))
    assert rows[0] == ["rollout_id", "n", "first"] and rows[1][:2] == ["fmt", "3"] and json.loads(rows[1][2])[0]
    out = tmp_path / "r.parquet"
    assert _spanrl("sql", "SELECT * FROM spans", *where, "--format", "parquet", "-o", str(out)).returncode == 0
    assert pq.read_table(out).num_rows == 3


def test_sql_write_statement_is_refused_with_message(collector_proc):
    _send(collector_proc, 2, "w")
    res = _spanrl("sql", "DELETE FROM spans", "--url", collector_proc.http_endpoint)
    assert res.returncode == 1 and "only read statements (SELECT, EXPLAIN) are allowed, got DELETE" in res.stderr
    assert collector_proc.sql("SELECT count(*) AS n FROM spans") == [{"n": 2}]


def test_export_and_prune_through_collector_then_on_file(collector_proc, tmp_path):
    _send(collector_proc, 5, "exp")
    where = ["--url", collector_proc.http_endpoint, "--db", str(collector_proc.db_path)]
    res = _spanrl("store", "export", "--parquet", str(tmp_path / "remote"), *where)
    assert res.returncode == 0, res.stderr
    assert pq.read_table(tmp_path / "remote" / "spans.parquet").num_rows == 5
    # Prune goes by ingest time (make_request's 1970 span times do not count): 7 days keeps them, 0 s does not.
    res = _spanrl("store", "prune", "--older-than", "7d", *where)
    assert res.returncode == 0 and "deleted 0 spans" in res.stdout
    res = _spanrl("store", "prune", "--older-than", "0s", *where)
    assert res.returncode == 0 and "deleted 5 spans" in res.stdout
    _send(collector_proc, 4, "later")
    assert collector_proc.terminate() == 0
    # No collector now: both commands open the file.
    res = _spanrl("store", "export", "--parquet", str(tmp_path / "local"), *where)
    assert res.returncode == 0, res.stderr
    assert pq.read_table(tmp_path / "local" / "rollouts.parquet").to_pylist()[0]["span_count"] == 4
    res = _spanrl("store", "prune", "--older-than", "0s", *where)
    assert res.returncode == 0 and "deleted 4 spans" in res.stdout
    res = _spanrl("store", "prune", "--older-than", "soon", *where)
    assert res.returncode == 2 and "spanrl: error: older_than must be" in res.stderr and "got 'soon'" in res.stderr


def test_sql_through_collector_with_token(collector_proc_factory):
    proc = collector_proc_factory(token="tok3n")
    where = ["--url", proc.http_endpoint, "--db", str(proc.db_path)]
    refused = _spanrl("sql", "SELECT 1 AS one", *where)
    assert refused.returncode == 1 and "answered 401" in refused.stderr and "bearer token" in refused.stderr
    ok = _spanrl("sql", "SELECT 1 AS one", *where, "--token", "tok3n", "--format", "json")
    assert ok.returncode == 0 and json.loads(ok.stdout) == [{"one": 1}]


def test_materialize_through_collector_then_on_file(collector_proc):
    body = make_request(2, rollout_id="done", name="spanrl.rollout")[0].SerializeToString()  # a finished rollout
    req = urllib.request.Request(f"{collector_proc.http_endpoint}/v1/traces", data=body,
                                 headers={"content-type": "application/x-protobuf"}, method="POST")
    urllib.request.urlopen(req, timeout=30).close()
    _send(collector_proc, 2, "open")  # no end: not kept
    where = ["--url", collector_proc.http_endpoint, "--db", str(collector_proc.db_path)]
    res = _spanrl("store", "materialize", *where)
    assert res.returncode == 0 and res.stdout.startswith("kept "), res.stderr  # 1, or 0 if the collector was first
    kept = "SELECT rollout_id, count(*) AS n FROM decomposed WHERE row_kind <> 'open' GROUP BY ALL ORDER BY ALL"
    assert collector_proc.sql(kept) == [{"rollout_id": "done", "n": 1}]  # its rollout row; it made no call
    assert collector_proc.terminate() == 0
    res = _spanrl("store", "materialize", *where)  # no collector now: on the file, nothing new to keep
    assert res.returncode == 0 and "kept 0 decomposed rollouts" in res.stdout, res.stderr
