"""The viewer opening a DuckDB file itself (no collector): its SQL box is sandboxed like the collector's
(issue 28, finding 6), its downloads cannot carry spreadsheet formulas (finding 9), and no web page can
reach it cross-site or by DNS rebinding (finding 5)."""

from __future__ import annotations

import csv
import io
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collector"))
from _otlp import make_request  # noqa: E402

from spanrl.collector.encoding import encode_request  # noqa: E402
from spanrl.store import SpanStore  # noqa: E402
from spanrl.ui.server import UiServer  # noqa: E402

_FORMULAS = ["=HYPERLINK(\"http://evil.example\",\"x\")", "+1+2", "-2+3", "@SUM(A1)", "plain", "\tTAB"]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    db = tmp_path_factory.mktemp("ui-file") / "spans.duckdb"
    store = SpanStore.open(db)
    for i, name in enumerate(_FORMULAS):
        store.append(encode_request(make_request(1, rollout_id=f"r{i}", name=name)[0]).table)
    store.close()
    server = UiServer.from_args(db=str(db), url="http://127.0.0.1:9", port=0).start()  # nothing answers on :9
    assert not server.app.source.remote
    yield server
    server.shutdown()


def _post(ui, path: str, body: bytes, **headers: str) -> tuple[int, bytes]:
    req = urllib.request.Request(ui.url.rstrip("/") + path, data=body, method="POST",
                                 headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _sql(ui, query: str, fmt: str = "json", **headers: str) -> tuple[int, bytes]:
    return _post(ui, "/api/sql", json.dumps({"sql": query, "format": fmt}).encode(), **headers)


@pytest.mark.parametrize("query", [
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM read_text('/proc/self/environ')",
    "SELECT * FROM glob('/etc/*')",
    "SELECT * FROM read_csv('http://127.0.0.1:9/x.csv')",
    "SELECT * FROM read_parquet('https://example.com/x.parquet')",
])
def test_file_mode_sql_box_reads_no_file_and_no_url(ui, query):
    status, body = _sql(ui, query)
    assert status == 400, body
    assert b"root:" not in body and b"PATH=" not in body
    assert b"disabled by configuration" in body


def test_file_mode_sql_box_still_reads_the_store(ui):
    status, body = _sql(ui, "SELECT count(*) AS n FROM spans")
    assert status == 200 and json.loads(body)["rows"] == [[len(_FORMULAS)]]


def test_csv_download_escapes_formula_cells(ui):
    status, body = _sql(ui, "SELECT name, rollout_id FROM spans ORDER BY rollout_id", "csv")
    assert status == 200
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    names = [r["name"] for r in rows]
    assert names == ["'" + n if n[0] in "=+-@\t" else n for n in _FORMULAS]
    assert [r["rollout_id"] for r in rows] == [f"r{i}" for i in range(len(_FORMULAS))]


def test_text_plain_post_and_foreign_origin_are_refused(ui):
    body = json.dumps({"sql": "SELECT name FROM spans", "format": "csv"}).encode()
    assert _post(ui, "/api/sql", body, **{"content-type": "text/plain"})[0] == 415
    status, reply = _post(ui, "/api/sql", body, origin="http://evil.example")
    assert status == 403 and b"cross-site" in reply
    assert _post(ui, "/api/sql", body, origin=ui.url.rstrip("/"))[0] == 200


@pytest.mark.parametrize("path", ["/", "/api/rollouts"])
def test_dns_rebinding_host_is_refused(ui, path):
    req = urllib.request.Request(ui.url.rstrip("/") + path, headers={"host": f"evil.example:{ui.port}"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert info.value.code == 403
    ok = urllib.request.Request(ui.url.rstrip("/") + path, headers={"host": f"localhost:{ui.port}"})
    with urllib.request.urlopen(ok, timeout=30) as resp:
        assert resp.status == 200
