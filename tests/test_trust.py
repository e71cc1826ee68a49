"""spanrl.trust: tokens per scope and the cross-site / rebinding refusals shared by the three HTTP servers."""

from __future__ import annotations

import argparse

import pytest

from spanrl.errors import ConfigError
from spanrl.trust import (SCOPES, Tokens, add_token_option, browser_refusal, is_loopback, read_token_file,
                          token_from_args)


def test_all_scope_token_grants_everything_and_scoped_tokens_one_each():
    tokens = Tokens.of(all_scopes="all", ingest="i", read="r", admin="a", policy="p")
    assert tokens.scopes_of("Bearer all") == frozenset(SCOPES)
    assert tokens.scopes_of("Bearer i") == {"ingest"}
    assert tokens.scopes_of("bearer  r ") == {"read"}
    assert tokens.scopes_of("Bearer p") == {"ingest", "policy"}
    assert tokens.scopes_of("Bearer nope") == set() and tokens.scopes_of(None) == set()
    assert tokens.scopes_of("Basic i") == set()
    assert not tokens.allows("Bearer i", "admin") and tokens.allows("Bearer a", "admin")


def test_a_scope_no_token_grants_is_open():
    tokens = Tokens.of(admin="a")
    assert tokens.allows(None, "ingest") and tokens.allows(None, "read")
    assert not tokens.allows(None, "admin")
    assert Tokens().allows(None, "admin")


@pytest.mark.parametrize(("host", "loopback"),
                         [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True),
                                                ("localhost", True), ("LOCALHOST.", True), ("a.localhost", True),
                                                ("0.0.0.0", False), ("10.0.0.1", False), ("evil.example", False),
                                                ("127.0.0.1.nip.io", False), ("", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(("method", "headers", "bound", "status"), [
    ("GET", {"host": "127.0.0.1:4318"}, "127.0.0.1", None),
    ("GET", {"host": "[::1]:4318"}, "::1", None),
    ("GET", {"host": "evil.example:4318"}, "127.0.0.1", 403),
    ("GET", {"host": "evil.example:4318"}, "0.0.0.0", None),  # not loopback: the Host can be any name
    ("POST", {"host": "127.0.0.1:1", "content-type": "application/json"}, "127.0.0.1", None),
    ("POST", {"host": "127.0.0.1:1", "content-type": "application/json; charset=utf-8"}, "127.0.0.1", None),
    ("POST", {"host": "127.0.0.1:1", "content-type": "text/plain"}, "127.0.0.1", 415),
    ("POST", {"host": "127.0.0.1:1"}, "127.0.0.1", 415),
    ("POST", {"host": "127.0.0.1:1", "content-type": "application/json", "origin": "http://127.0.0.1:1"}, "127.0.0.1",
     None),
    ("POST", {"host": "127.0.0.1:1", "content-type": "application/json", "origin": "http://127.0.0.1:2"}, "127.0.0.1",
     403),
    ("POST", {"host": "127.0.0.1:1", "content-type": "application/json", "origin": "null"}, "127.0.0.1", 403),
    ("GET", {"host": "127.0.0.1:1", "origin": "http://evil.example"}, "127.0.0.1", 403),
    ("DELETE", {"host": "127.0.0.1:1", "content-type": "text/plain"}, "127.0.0.1", 415),
])
def test_browser_refusal(method, headers, bound, status):
    refusal = browser_refusal(method, headers, bound_host=bound)
    assert (refusal[0] if refusal else None) == status


def test_token_file_and_flag(tmp_path):
    parser = argparse.ArgumentParser()
    add_token_option(parser, "--admin-token", "admin")
    (tmp_path / "t").write_text("  s3cret\n")
    assert token_from_args(parser.parse_args(["--admin-token-file", str(tmp_path / "t")]), "--admin-token") == "s3cret"
    assert token_from_args(parser.parse_args(["--admin-token", "x"]), "--admin-token") == "x"
    assert token_from_args(parser.parse_args([]), "--admin-token") is None
    with pytest.raises(ConfigError, match="give --admin-token or --admin-token-file, not both"):
        token_from_args(parser.parse_args(["--admin-token", "x", "--admin-token-file", str(tmp_path / "t")]),
                        "--admin-token")
    (tmp_path / "two").write_text("a b\n")
    with pytest.raises(ConfigError, match="must hold one token without whitespace"):
        read_token_file(tmp_path / "two", field="--admin-token-file")
    with pytest.raises(ConfigError, match="cannot read the token file"):
        read_token_file(tmp_path / "absent", field="--admin-token-file")
