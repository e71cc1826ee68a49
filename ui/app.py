"""The viewer's HTTP side: a raw ASGI app (served by uvicorn, a base dependency) with a small JSON API
and the static page. Store work runs in worker threads, never on the event loop.

    GET  /                        the page (static/index.html); assets under /static/
    GET  /api/info                what is read, the runs, whether a tokenizer decodes completions
    GET  /api/rollouts            ?status=&mode=&q=&sort=&desc=1&limit=&offset= -> counts, total, rows
    GET  /api/rollout?id=ID       spans, calls (messages, tokens, log-probs), rewards at their step
    GET  /api/credit?id=ID        transitions with return and advantage, the group, skipped calls
    GET  /api/runs                each run's history rows, and the policy versions from the store
    POST /api/sql                 {"sql": ..., "format": "json" | "csv" | "parquet"}

Every /api route needs ``Authorization: Bearer TOKEN`` when a token is set (the collector's read token).
Every request passes `spanrl.trust.browser_refusal` first: a POST must be ``application/json``, a foreign
``Origin`` is refused, and served on loopback, a ``Host`` that is not loopback (DNS rebinding).
Errors: 400 bad input (names the field), 401 token, 403 cross-site or rebinding, 404 unknown rollout or
path, 415 content type, 503 + Retry-After when the store cannot be read right now.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from typing import Any, Sequence
from urllib.parse import parse_qs

import orjson

from spanrl.algorithms.credit import CreditConfig
from spanrl.errors import ConfigError, StoreError, StoreUnavailableError
from spanrl.ui.credit import rollout_credit
from spanrl.ui.detail import RolloutNotFoundError, rollout_detail
from spanrl.ui.rollouts import RolloutFilter, RolloutIndex
from spanrl.ui.runs import Run, policy_versions
from spanrl.ui.source import Source
from spanrl.ui.sqlbox import run_sql
from spanrl.ui.subset import Scratch
from spanrl.ui.tokens import TokenText
from spanrl.http_server import Receive, Send, respond
from spanrl.trust import Tokens, browser_refusal

__all__ = ["UiApp"]

_logger = logging.getLogger(__name__)

_STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png"}
_MAX_BODY = 1 << 20
_RETRY_AFTER_S = "2"
_SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"cache-control", b"no-store"),
                     (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; style-src 'self'")]


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class UiApp:
    """The ASGI application over one `Source`; ``runs`` feed the run page, ``credit`` the advantages."""

    def __init__(self, source: Source, *, token: str | None = None, runs: Sequence[Run] = (),
                 credit: CreditConfig | None = None, tokens: TokenText | None = None,
                 bound_host: str = "127.0.0.1") -> None:
        self.source = source
        self.index = RolloutIndex(source)
        self.scratch = Scratch()
        self.runs = list(runs)
        self.credit = credit or CreditConfig()
        self.tokens = tokens or TokenText()
        self._tokens = Tokens.of(read=token)
        self._bound_host = bound_host

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # served with lifespan="off"
            return
        path, method = scope["path"], scope["method"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        try:
            refusal = browser_refusal(method, headers, bound_host=self._bound_host)
            if refusal is not None:
                raise _HttpError(*refusal)
            if not path.startswith("/api/"):
                await self._static(send, path)
                return
            if not self._tokens.allows(headers.get("authorization"), "read"):
                raise _HttpError(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>', "
                                      "the collector's token)")
            body = await _read_body(receive) if method == "POST" else b""
            result = await asyncio.to_thread(self._api, method, path, query, body)
            if isinstance(result, tuple):
                payload, content_type, filename = result
                extra = [(b"content-disposition", f'attachment; filename="{filename}"'.encode())]
                await _respond(send, 200, payload, content_type, extra)
            else:
                payload = orjson.dumps(result, default=str, option=orjson.OPT_NON_STR_KEYS)
                await _respond(send, 200, payload, "application/json")
        except _HttpError as exc:
            await _error(send, exc.status, str(exc))
        except RolloutNotFoundError as exc:
            await _error(send, 404, str(exc))
        except ConfigError as exc:
            await _error(send, 400, str(exc))
        except StoreError as exc:
            await _store_error(send, exc, user_sql=path == "/api/sql")

    def _api(self, method: str, path: str, query: dict[str, str], body: bytes) -> Any:
        if method == "GET" and path == "/api/info":
            return {"source": self.source.description, "runs": [r.name for r in self.runs],
                    "tokenizer": str(self.tokens.path) if self.tokens.path else None,
                    "credit": {k: getattr(self.credit, k) for k in ("mode", "baseline", "gamma", "scale_std")}}
        if method == "GET" and path == "/api/rollouts":
            return self.index.query(_rollout_filter(query))
        if method == "GET" and path == "/api/rollout":
            return rollout_detail(self.source, self.scratch, _required(query, "id"), self.tokens)
        if method == "GET" and path == "/api/credit":
            rid = _required(query, "id")
            return rollout_credit(self.source, self.scratch, self.index.refresh(), rid, self.credit)
        if method == "GET" and path == "/api/runs":
            return {"runs": [r.read() for r in self.runs], "policy_versions": policy_versions(self.source)}
        if method == "POST" and path == "/api/sql":
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise ConfigError(f"the body must be JSON like {{\"sql\": \"SELECT 1\"}}: {exc}") from None
            if not isinstance(doc, dict):
                raise ConfigError(f"the body must be a JSON object with 'sql', got {type(doc).__name__}")
            fmt = doc.get("format", "json")
            result, content_type = run_sql(self.source, doc.get("sql"), fmt)
            return result if fmt == "json" else (result, content_type, f"spanrl-query.{fmt}")
        raise _HttpError(404, f"no route {method} {path}")

    async def _static(self, send: Send, path: str) -> None:
        name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
        if name == path or "/" in name or name.startswith("."):
            raise _HttpError(404, f"no page at {path}")
        ext = name[name.rfind("."):] if "." in name else ""
        resource = resources.files("spanrl.ui").joinpath("static", name)
        if ext not in _STATIC_TYPES or not resource.is_file():
            raise _HttpError(404, f"no page at {path}")
        await _respond(send, 200, resource.read_bytes(), _STATIC_TYPES[ext])


def _required(query: dict[str, str], name: str) -> str:
    value = query.get(name, "").strip()
    if not value:
        raise ConfigError(f"the query parameter {name!r} is required")
    return value


_BIGINT_MAX = 2**63 - 1  # DuckDB's LIMIT and OFFSET are BIGINTs: past it the query failed, answered 500


def _rollout_filter(query: dict[str, str]) -> RolloutFilter:
    def integer(name: str, default: int) -> int:
        """The parameter as an integer (its range is RolloutFilter's to check); ASCII digits only: int()
        also takes "1_000", " 7" and other scripts' digits."""
        raw = query.get(name)
        if raw in (None, ""):
            return default
        if not (raw.isascii() and raw.removeprefix("-").isdigit()) or abs(int(raw)) > _BIGINT_MAX:
            raise ConfigError(f"the query parameter {name!r} must be an integer of at most {_BIGINT_MAX}, got {raw!r}")
        return int(raw)

    return RolloutFilter(
        status=query.get("status") or None,
        mode=query.get("mode") or None,
        text=query.get("q") or None,
        sort=query.get("sort") or "start_ns",
        descending=query.get("desc", "1") not in ("0", "false"),
        limit=integer("limit", 200),
        offset=integer("offset", 0),
    )


async def _read_body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            raise _HttpError(413, f"the request body is over {_MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _respond(send: Send, status: int, body: bytes, content_type: str,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await respond(send, status, body, content_type, [*_SECURITY_HEADERS, *(extra or ())])


async def _error(send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await _respond(send, status, orjson.dumps({"error": message}), "application/json", extra)


async def _store_error(send: Send, exc: StoreError, *, user_sql: bool) -> None:
    text = str(exc)
    if user_sql and not isinstance(exc, StoreUnavailableError):
        await _error(send, 400, text)  # the query is wrong: retrying will not help
        return
    _logger.warning("store read failed: %s", text)
    await _error(send, 503, f"the span store cannot be read right now: {text}",
                 [(b"retry-after", _RETRY_AFTER_S.encode())])
