"""``spanrl store import FILE``: trajectories from files, through the collector's own door.

OTLP JSON lines, as the OpenTelemetry Collector's file exporter writes them (one ``ExportTraceServiceRequest``
in OTLP/JSON per line), are sent line by line to a collector's ``POST /v1/traces`` (the one at ``--url`` when it
serves the file, else one started here on it, on a free loopback port): the live path's decoding, token scopes,
rollout claims and reward checks, nothing written beside them. The store keeps every copy of a span it is sent
(readers count the first), so a re-import sends only the spans whose ``(trace_id, span_id)`` the store does
not hold yet: importing a file twice stores it once. The collector acknowledges a line once it is committed, so
the next line's look-up sees it. A logs line (an ``ExportLogsServiceRequest``) comes here already turned into the
spans live ``/v1/logs`` makes of its GenAI events (store/_cli.py, collector/logs.py), with the same span ids.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from spanrl.errors import ConfigError, StoreError

__all__ = ["ImportReport", "import_otlp_lines", "read_otlp_lines"]

_TIMEOUT_S = 300.0
_MAX_ERRORS_KEPT = 10


@dataclass
class ImportReport:
    """What an import did: lines read, spans sent, spans skipped as already stored, spans the collector
    refused (with its first reasons)."""

    lines: int = 0
    spans_sent: int = 0
    spans_already_stored: int = 0
    spans_rejected: int = 0
    errors: list[str] = field(default_factory=list)


def read_otlp_lines(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, request)`` for each non-blank line of ``path``; `ConfigError` names a bad line."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{number}: not JSON ({exc}); each line must be one OTLP/JSON "
                                  "ExportTraceServiceRequest") from None
            if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans", []), list):
                raise ConfigError(f"{path}:{number}: must be an object with resourceSpans (an OTLP/JSON "
                                  f"ExportTraceServiceRequest), got {str(doc)[:80]!r}")
            yield number, doc


def _spans(doc: dict[str, Any]) -> Iterable[tuple[list[Any], dict[str, Any]]]:
    for rs in doc.get("resourceSpans") or ():
        for ss in (rs.get("scopeSpans") or ()) if isinstance(rs, dict) else ():
            spans = ss.get("spans") if isinstance(ss, dict) else None
            if isinstance(spans, list):
                for span in list(spans):
                    if isinstance(span, dict):
                        yield spans, span


def _key(span: dict[str, Any]) -> tuple[str, str] | None:
    t, s = span.get("traceId", span.get("trace_id")), span.get("spanId", span.get("span_id"))
    return (t.lower(), s.lower()) if isinstance(t, str) and isinstance(s, str) else None


def _post(url: str, token: str | None, doc: dict[str, Any]) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{url.rstrip('/')}/v1/traces", data=orjson.dumps(doc), headers=headers,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        raise StoreError(f"collector at {url} refused the spans: {exc.code} "
                         f"{exc.read().decode(errors='replace')[:300]}") from None
    except OSError as exc:
        raise StoreError(f"no collector answered at {url}: {exc}") from None
    return json.loads(body or b"{}")


def import_otlp_lines(
    requests: Iterable[tuple[int, dict[str, Any]]], *, url: str, token: str | None,
    stored: Callable[[list[str]], set[tuple[str, str]]],
) -> ImportReport:
    """Send each request to the collector at ``url`` without the spans already stored. ``stored(trace_ids)``
    returns the ``(trace_id, span_id)`` pairs the store holds for those traces (lowercase hex)."""
    report, seen = ImportReport(), set()
    for number, doc in requests:
        report.lines += 1
        keys = {k for _, span in _spans(doc) if (k := _key(span)) is not None}
        have = stored(sorted({t for t, _ in keys})) | seen if keys else seen
        sent = 0
        for spans, span in _spans(doc):
            key = _key(span)
            if key is not None and key in have:
                spans.remove(span)
                report.spans_already_stored += 1
            else:
                sent += 1
                if key is not None:
                    seen.add(key)
        if not sent:
            continue
        answer = _post(url, token, doc)
        partial = answer.get("partialSuccess") or {}
        rejected = int(partial.get("rejectedSpans") or 0)
        report.spans_sent += sent - rejected
        report.spans_rejected += rejected
        if rejected and len(report.errors) < _MAX_ERRORS_KEPT:
            report.errors.append(f"line {number}: {partial.get('errorMessage', '')}")
    return report
