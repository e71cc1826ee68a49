"""`RemoteStore`: read-only SQL through a running collector's HTTP endpoint (``POST /v1/sql``).

DuckDB lets one process hold the file, so while a collector runs, other processes query through it.
Results travel as an Arrow IPC stream, so types (lists, BIGINT, DOUBLE) arrive intact.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Sequence

import pyarrow as pa

from spanrl.errors import StoreError, StoreUnavailableError

__all__ = ["RemoteStore"]

_ARROW_STREAM_TYPE = "application/vnd.apache.arrow.stream"
_PING_TIMEOUT_S = 0.5
_SQL_TIMEOUT_S = 300.0


class RemoteStore:
    """SQL over HTTP against the collector at ``url`` (``http://HOST:PORT``)."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = _SQL_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s

    def health(self, timeout_s: float = _PING_TIMEOUT_S) -> dict[str, Any] | None:
        """The collector's ``/health`` document, or None when no collector answers there.

        ``status`` is ``ok``, or ``failing`` / ``recovering`` / ``failed`` (with ``error``) while its commits
        fail (a full disk), while its store is reopened after a DuckDB failure, or when it could not be
        (answered 503, still this collector's file).
        """
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read() if exc.code == 503 else b""
        except OSError:
            return None
        try:
            doc = json.loads(body)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) and doc.get("status") in ("ok", "failing", "recovering", "failed") else None

    def _post(self, path: str, doc: dict[str, Any], accept: str) -> bytes:
        headers = {"content-type": "application/json", "accept": accept}
        if self._token:
            headers["authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(f"{self.url}{path}", data=json.dumps(doc).encode(), headers=headers,
                                         method="POST")

        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                message = json.loads(body).get("message", body.decode(errors="replace"))
            except ValueError:
                message = body.decode(errors="replace")
            error = StoreUnavailableError if exc.code == 503 else StoreError  # 503: its store is reopening
            raise error(f"collector at {self.url} answered {exc.code}: {message}") from None
        except OSError as exc:
            raise StoreUnavailableError(f"no collector answered at {self.url}: {exc}") from None

    def sql(self, query: str, params: Sequence[Any] | dict[str, Any] | None = None) -> pa.Table:
        """Run one read statement on the collector's store; `StoreError` carries the collector's message
        (`StoreUnavailableError` when no collector answers or it answered 503)."""
        doc: dict[str, Any] = {"sql": query}
        if params is not None:
            doc["params"] = params if isinstance(params, dict) else list(params)
        payload = self._post("/v1/sql", doc, _ARROW_STREAM_TYPE)
        return pa.ipc.open_stream(pa.py_buffer(payload)).read_all()

    def prune(self, older_than_s: float) -> int:
        """Delete rollouts (and rollout-less spans) that ended over ``older_than_s`` ago; the span count deleted."""
        payload = self._post("/v1/prune", {"older_than_s": older_than_s}, "application/json")
        return int(json.loads(payload)["deleted_spans"])

    def materialize(self) -> dict[str, int]:
        """Keep the decomposition of finished rollouts now (store/kept_rollouts.py); the counts it returns."""
        return dict(json.loads(self._post("/v1/materialize", {}, "application/json")))
