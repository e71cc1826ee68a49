"""Reading a request before it reaches the model: the body (bounded, strict JSON) and its tokenization
(off the event loop).

A body over ``max_body_bytes`` is answered 413 from its Content-Length, before it is read; a chunked
one is read only up to the limit. JSON is parsed strictly: NaN / Infinity and nesting deeper than
``MAX_JSON_DEPTH`` are 400s, not 500s. Chat templating and tokenizing run on a small pool whose
threads each own a tokenizer copy (a Rust tokenizer shared across threads can fail with "Already
borrowed"), so a multi-MiB prompt never stalls ``/health`` or other requests.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from starlette.requests import Request

from spanrl.serving.errors import RequestError

__all__ = ["MAX_JSON_DEPTH", "TokenizerPool", "read_json_body"]

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays/objects a request body may have (tool schemas need a few levels)."""
_TOKENIZER_THREADS = 2

T = TypeVar("T")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid JSON number")


def _depth_ok(doc: Any) -> bool:
    """Whether ``doc`` nests at most MAX_JSON_DEPTH levels (iterative: no recursion to overflow)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return False
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def _too_large(limit: int, field: str) -> RequestError:
    return RequestError(f"the request body is larger than the server's limit of {limit} bytes ({field})",
                        status=413, code="request_too_large")


async def read_body_bytes(request: Request, max_bytes: int, field: str = "max_body_bytes") -> bytes:
    """The request's body; `RequestError` 413 naming ``field`` (the limit's setting) when over ``max_bytes``."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise _too_large(max_bytes, field)  # answered without reading the body
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes, field)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_body(request: Request, max_bytes: int) -> dict[str, Any]:
    """The request's JSON object; `RequestError` 413 when too large, 400 when not a JSON object."""
    data = await read_body_bytes(request, max_bytes)
    try:
        body = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise RequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    if not _depth_ok(body):
        raise RequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    return body


class TokenizerPool:
    """Runs tokenizer work on its own threads, each with its own copy of the tokenizer."""

    def __init__(self, tokenizer: Any, threads: int = _TOKENIZER_THREADS) -> None:
        self._tokenizer = tokenizer
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="spanrl-tokenize")

    def _own(self) -> Any:
        tok = getattr(self._local, "tokenizer", None)
        if tok is None:
            tok = self._local.tokenizer = copy.deepcopy(self._tokenizer)
        return tok

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(tokenizer, *args)`` on a pool thread, with that thread's tokenizer."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(self._own(), *args))

    def shutdown(self) -> None:
        """Stop the threads. Safe twice."""
        self._pool.shutdown(wait=False, cancel_futures=True)
