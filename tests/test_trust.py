"""spanrl.trust: tokens per scope and the cross-site / rebinding refusals shared by the three HTTP servers."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import pytest

from spanrl.errors import ConfigError
from spanrl.trust import (SCOPES, Tokens, add_token_option, browser_refusal, env_token, is_loopback, open_scopes_line,
                          read_token_file, token_from_args)


def test_all_scope_token_grants_everything_and_scoped_tokens_one_each():
    tokens = Tokens.of(all_scopes="all", ingest="i", read="r", admin="a", policy="p")
    assert tokens.scopes_of("Bearer all") == frozenset(SCOPES)
    assert tokens.scopes_of("Bearer i") == {"ingest"}
    assert tokens.scopes_of("bearer  r ") == {"read"}
    assert tokens.scopes_of("Bearer p") == {"ingest", "policy"}
    assert tokens.scopes_of("Bearer nope") == set() and tokens.scopes_of(None) == set()
    assert tokens.scopes_of("Basic i") == set()
    assert not tokens.allows("Bearer i", "admin") and tokens.allows("Bearer a", "admin")


def test_a_scope_no_token_grants_is_closed_once_any_token_is_set():
    """Issue 53, finding 1: ``--ingest-token-file`` alone left SQL, prune and materialize open to anyone."""
    tokens = Tokens.of(ingest="i")
    for scope in ("read", "admin", "policy"):
        assert not tokens.allows(None, scope) and not tokens.allows("Bearer i", scope)
        assert "closed (fail closed); start it with --x" in tokens.refusal(scope, "/v1/sql", "--x")
    assert tokens.allows("Bearer i", "ingest") and not tokens.allows(None, "ingest")
    assert "missing or wrong bearer token" in tokens.refusal("ingest", "/v1/traces", "--x")
    assert Tokens().allows(None, "admin")  # no token at all: open, allowed on loopback only (below)


def test_open_scopes_are_said_on_loopback_and_refused_beyond_it():
    line = open_scopes_line(Tokens(), ("ingest", "read"), server="collector", host="127.0.0.1")
    assert line == ("collector: no token configured, so the scopes ingest, read are open to anyone on this machine; "
                    "allowed because it is bound to loopback (127.0.0.1): development only")
    with pytest.raises(ConfigError, match=r"host 0\.0\.0\.0 is beyond loopback and the scopes ingest, read have no "
                                          r"token.*refused \(fail closed\)"):
        open_scopes_line(Tokens(), ("ingest", "read"), server="collector", host="0.0.0.0")
    assert open_scopes_line(Tokens.of(ingest="i"), SCOPES, server="collector", host="0.0.0.0") is None


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


def test_a_token_file_every_user_can_read_is_refused(tmp_path):
    """Finding 7: world-readable token files were accepted silently. Refused as ssh refuses such a key,
    unless a private folder above it keeps other users out (pytest's tmp_path is one)."""
    inside = tmp_path / "t"
    inside.write_text("s3cret\n")
    inside.chmod(0o644)
    assert read_token_file(inside, field="--read-token-file") == "s3cret"  # under a 0700 folder
    with tempfile.TemporaryDirectory() as shared:  # the system's temporary folder: other users may enter
        os.chmod(shared, 0o755)
        if any(not p.stat().st_mode & 0o001 for p in Path(shared).resolve().parents):
            pytest.skip(f"a folder above {shared} keeps other users out of every file under it")
        token = Path(shared) / "t"
        token.write_text("s3cret\n")
        token.chmod(0o644)
        with pytest.raises(ConfigError, match=r"--read-token-file: the token file .* is readable by every user of "
                                              r"this machine \(mode 0o644\); refused, as ssh refuses such a key: "
                                              r"run chmod 600"):
            read_token_file(token, field="--read-token-file")
        token.chmod(0o600)
        assert read_token_file(token, field="--read-token-file") == "s3cret"


def test_env_token_reads_the_variable_or_its_file(tmp_path, monkeypatch):
    monkeypatch.delenv("SPANRL_COLLECTOR_READ_TOKEN", raising=False)
    monkeypatch.delenv("SPANRL_COLLECTOR_READ_TOKEN_FILE", raising=False)
    assert env_token("SPANRL_COLLECTOR_READ_TOKEN") is None
    (tmp_path / "r").write_text("from-file\n")
    monkeypatch.setenv("SPANRL_COLLECTOR_READ_TOKEN_FILE", str(tmp_path / "r"))
    assert env_token("SPANRL_COLLECTOR_READ_TOKEN") == "from-file"
    monkeypatch.setenv("SPANRL_COLLECTOR_READ_TOKEN", "from-var")
    with pytest.raises(ConfigError, match="set SPANRL_COLLECTOR_READ_TOKEN or SPANRL_COLLECTOR_READ_TOKEN_FILE, not"):
        env_token("SPANRL_COLLECTOR_READ_TOKEN")
