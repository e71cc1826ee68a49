"""One way to serve an ASGI app: uvicorn on a socket bound here, on its own thread and event loop.

The collector's OTLP/HTTP receiver, the policy server and the viewer each bind their socket first (so a
port in use is their own clear error, and port 0 is known before serving), then hand it to
`ThreadedServer`. ``url_host`` writes a bound host the way a URL needs it. uvicorn is imported only when
a server is built: ``import spanrl`` stays light. The two raw ASGI apps (the collector's OTLP/HTTP, the
viewer) answer through `respond`; each keeps its own error body (OTLP's Status, the viewer's ``{"error"}``).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Awaitable, Callable

__all__ = ["Receive", "Send", "ThreadedServer", "bind", "bracketed", "respond", "url_host"]

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


async def respond(send: Send, status: int, body: bytes, content_type: str,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    """One whole ASGI response: ``body`` with its content type and length, then ``headers``."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()),
                            *(headers or ())]})
    await send({"type": "http.response.body", "body": body})


def bracketed(host: str) -> str:
    """``host`` as it goes before ``:PORT`` (a URL, a gRPC address): an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def url_host(host: str) -> str:
    """A bound ``host`` as a URL's host: a wildcard address as its loopback (what a local client reaches)."""
    return bracketed({"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host))


def bind(host: str, port: int, *, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host has a colon). Raises ``OSError``.

    Proto ``IPPROTO_TCP``, so asyncio sets TCP_NODELAY on the connections it accepts (else +40 ms a small
    request). Listening here: connections queue from now on, before uvicorn's loop accepts them."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


class ThreadedServer:
    """An ASGI ``app`` served by uvicorn on ``sock``: `start` in a background thread, or `run` in this one.

    ``options`` go to ``uvicorn.Config`` (its logging and lifespan are off here: the app's owner logs)."""

    def __init__(self, app: Any, sock: socket.socket, *, name: str, **options: Any) -> None:
        import uvicorn

        options = {"log_level": "warning", "access_log": False, "lifespan": "off", **options}
        self._server = uvicorn.Server(uvicorn.Config(app, **options))
        self._sock = sock
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def start(self, timeout_s: float) -> bool:
        """Serve in a daemon thread; True once uvicorn accepts, False if it died or did not start in time."""
        self._thread = threading.Thread(target=self.run, name=self._name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def run(self) -> None:
        """Serve in the calling thread until `shutdown` (uvicorn handles signals only in the main thread)."""
        self._server.run(sockets=[self._sock])

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish (uvicorn's graceful timeout), join the thread.
        Safe before `start` and twice."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._sock.close()
