"""spanrl.http_server: the one way the collector, the policy server and the viewer serve ASGI in a thread."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from spanrl.http_server import ThreadedServer, bind, bracketed, url_host


async def _hello(scope, receive, send) -> None:  # the smallest ASGI app
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


def _ipv6() -> bool:
    try:
        socket.socket(socket.AF_INET6).close()
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize(
    "host", ["127.0.0.1", pytest.param("::1", marks=pytest.mark.skipif(not _ipv6(), reason="no IPv6 loopback"))]
)
def test_serves_in_a_thread_on_a_port_it_bound_and_stops(host: str) -> None:
    server = ThreadedServer(_hello, bind(host, 0), name="test-http")
    assert server.start(10.0)
    url = f"http://{url_host(host)}:{server.port}/"
    assert urllib.request.urlopen(url, timeout=5).read() == b"hello"
    server.shutdown(5.0)
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)
    server.shutdown(5.0)  # twice is safe


def test_a_port_in_use_is_an_oserror_before_any_server() -> None:
    with bind("127.0.0.1", 0) as taken:
        with pytest.raises(OSError):
            bind("127.0.0.1", taken.getsockname()[1])


def test_hosts_in_urls_and_addresses() -> None:
    assert [url_host(h) for h in ("0.0.0.0", "", "::", "::1", "127.0.0.1", "example.org")] == [
        "127.0.0.1", "127.0.0.1", "[::1]", "[::1]", "127.0.0.1", "example.org"]
    assert [bracketed(h) for h in ("::", "10.0.0.1")] == ["[::]", "10.0.0.1"]
