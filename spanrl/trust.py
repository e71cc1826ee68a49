"""Who may send what to spanrl's three HTTP servers (collector, policy server, viewer): one helper, not three.

* Tokens and scopes: `Tokens` maps bearer tokens to the scopes they grant (``ingest``, ``policy``, ``read``,
  ``admin``); `Tokens.allows` answers whether a request's ``Authorization`` header may use one scope.
  Fail closed: once any token is configured, a scope no token grants is closed to everyone; with no token
  at all every scope is open, which `open_scopes_line` allows on loopback only (development) and says so
  in one line.
* Cross-site and DNS-rebinding requests: `browser_refusal` says why a request must be refused, or None.
  A browser sends a "simple" ``text/plain`` POST to any site without asking first, with the page's
  ``Origin``; a DNS-rebinding page reaches a loopback server under its own host name. So, as Jupyter and
  Ray's dashboard do: every POST needs its proper content type, a foreign ``Origin`` is refused, and a
  server bound to loopback refuses a ``Host`` that is not loopback.

Standard library only (the policy server, the viewer and the collector all import it).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import stat
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

from spanrl import env
from spanrl.errors import ConfigError

__all__ = ["SCOPES", "Tokens", "add_token_option", "browser_refusal", "check_token", "env_token", "is_loopback",
           "open_scopes_line", "read_token_file", "token_from_args"]

SCOPES = ("ingest", "policy", "read", "admin")
"""ingest: OTLP export; policy: OTLP export whose token ids and log-probs count as the policy server's own;
read: SQL and the viewer; admin: prune, materialize, weight reloads."""
_STATE_CHANGING = frozenset(("POST", "PUT", "PATCH", "DELETE"))


def read_token_file(path: str | Path, *, field: str) -> str:
    """The token in the file ``path`` (surrounding whitespace dropped); `ConfigError` naming ``field``."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
        exposed = _readable_by_others(Path(path))
    except OSError as exc:
        raise ConfigError(f"{field}: cannot read the token file {str(path)!r}: {exc.strerror or exc}") from None
    if exposed:
        raise ConfigError(f"{field}: the token file {str(path)!r} is readable by every user of this machine "
                          f"(mode {exposed}); refused, as ssh refuses such a key: run chmod 600 {str(path)!r}")
    if not text or any(c.isspace() for c in text):
        raise ConfigError(f"{field}: the token file {str(path)!r} must hold one token without whitespace")
    return text


def _readable_by_others(path: Path) -> str | None:
    """The file's mode (``0o644``) when any user can read it: it grants others read and every folder above
    it lets them in (a file in a private folder, such as pytest's or ~/.ssh, is not exposed). Else None."""
    if os.name != "posix":
        return None
    mode = path.stat().st_mode
    if not mode & stat.S_IROTH:
        return None
    for folder in path.resolve().parents:
        if not folder.stat().st_mode & stat.S_IXOTH:
            return None
    return oct(stat.S_IMODE(mode))


def env_token(name: str) -> str | None:
    """The token in the variable ``name``, else in the file the variable ``name + "_FILE"`` names (the
    convention of Docker's secrets), else None. Both set: `ConfigError`."""
    value, path = env.get_str(name), env.get_str(name + env.TOKEN_FILE_SUFFIX)
    if value is not None and path is not None:
        raise ConfigError(f"set {name} or {name}{env.TOKEN_FILE_SUFFIX}, not both")
    return read_token_file(path, field=name + env.TOKEN_FILE_SUFFIX) if path is not None else value


def check_token(token: str | None, *, field: str) -> None:
    """`ConfigError` unless ``token`` is None or a non-empty string without whitespace."""
    if token is not None and (not isinstance(token, str) or not token or any(c.isspace() for c in token)):
        raise ConfigError(f"{field} must be a non-empty string without whitespace, or None for no auth")


def _bearer(header: str | None) -> bytes | None:
    scheme, _, value = (header or "").partition(" ")
    return value.strip().encode() if scheme.lower() == "bearer" and value.strip() else None


class Tokens:
    """Bearer tokens and the scopes each grants. ``Tokens({"t1": SCOPES, "t2": ("ingest",)})``."""

    def __init__(self, grants: Mapping[str, Iterable[str]] | None = None) -> None:
        self._grants: list[tuple[bytes, frozenset[str]]] = []
        for token, scopes in (grants or {}).items():
            scopes = frozenset(scopes)
            unknown = scopes - set(SCOPES)
            if unknown:
                raise ConfigError(f"token scopes must be among {SCOPES}, got {sorted(unknown)}")
            self._grants.append((token.encode(), scopes))
        # Fail closed: once any token is configured, every scope needs one (a scope no token grants is closed).
        self._granted = frozenset().union(*(s for _, s in self._grants)) if self._grants else frozenset()
        self._guarded = frozenset(SCOPES) if self._grants else frozenset()

    @classmethod
    def of(cls, *, all_scopes: str | None = None, **scoped: str | None) -> "Tokens":
        """``all_scopes`` grants every scope (``--token``); ``ingest=``, ``policy=``, ``read=``, ``admin=`` one
        each (``policy`` also grants ``ingest``). None values are skipped."""
        grants: dict[str, set[str]] = {}
        if all_scopes is not None:
            grants.setdefault(all_scopes, set()).update(SCOPES)
        for scope, token in scoped.items():
            if scope not in SCOPES:
                raise ConfigError(f"token scopes must be among {SCOPES}, got {scope!r}")
            if token is not None:
                grants.setdefault(token, set()).update(("ingest", "policy") if scope == "policy" else (scope,))
        return cls(grants)

    def guarded(self, scope: str) -> bool:
        """Whether ``scope`` needs a token (any token is configured); else it is open to every request."""
        return scope in self._guarded

    def granted(self, scope: str) -> bool:
        """Whether some token grants ``scope``: guarded but granted by none, the scope is closed to everyone."""
        return scope in self._granted

    def refusal(self, scope: str, what: str, fix: str) -> str:
        """Why a request without a token of ``scope`` is refused (for a 401), naming ``fix`` when the scope
        is closed because no token grants it."""
        if not self.granted(scope):
            return (f"{what} needs a token of scope {scope!r}, and this server has none configured, so the scope is "
                    f"closed (fail closed); start it with {fix}")
        return f"missing or wrong bearer token for {what}, which needs a token of scope {scope!r} " \
               "(header 'Authorization: Bearer <token>')"

    def allows(self, header: str | None, scope: str) -> bool:
        """Whether a request with this ``Authorization`` header may use ``scope``."""
        if scope not in self._guarded:
            return True
        return scope in self.scopes_of(header)

    def scopes_of(self, header: str | None) -> frozenset[str]:
        """The scopes the header's bearer token grants (empty for none or a wrong one); every token is
        compared in constant time."""
        value = _bearer(header)
        found: frozenset[str] = frozenset()
        if value is None:
            return found
        for token, scopes in self._grants:
            if hmac.compare_digest(value, token):
                found = found | scopes
        return found


def open_scopes_line(tokens: Tokens, scopes: Iterable[str], *, server: str, host: str) -> str | None:
    """None when every one of ``scopes`` needs a token; else the one line that says they are open to anyone
    and why that is allowed (bound to loopback: development). Beyond loopback: `ConfigError` naming them."""
    open_ = [s for s in scopes if not tokens.guarded(s)]
    if not open_:
        return None
    if not is_loopback(host):
        raise ConfigError(f"{server}: host {host} is beyond loopback and the scopes {', '.join(open_)} have no token, "
                          "so anyone who reaches it could use them: refused (fail closed). Give a token of each "
                          "scope, or bind 127.0.0.1")
    return (f"{server}: no token configured, so the scopes {', '.join(open_)} are open to anyone on this machine; "
            f"allowed because it is bound to loopback ({host}): development only")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name, without port) is a loopback one."""
    host = host.strip().strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(netloc: str) -> str:
    return urlsplit("//" + netloc).hostname or ""


def browser_refusal(method: str, headers: Mapping[str, str], *, bound_host: str,
                    content_types: Iterable[str] = ("application/json",)) -> tuple[int, str] | None:
    """(status, reason) when the request must be refused, else None. ``headers`` have lowercase names.

    * ``bound_host`` loopback and the ``Host`` header not: 403 (DNS rebinding);
    * an ``Origin`` other than the server's own (``Origin`` ``null`` included): 403 (a cross-site page);
    * a POST / PUT / PATCH / DELETE whose ``Content-Type`` is not in ``content_types``: 415 (a browser's
      simple ``text/plain`` or form POST).
    """
    host = headers.get("host", "")
    if is_loopback(bound_host) and host and not is_loopback(_hostname(host)):
        return 403, (f"Host {host!r} is not a loopback name, and this server is bound to {bound_host}: "
                     "refused (DNS rebinding); use http://127.0.0.1 or http://localhost")
    origin = headers.get("origin")
    if origin is not None:
        parts = urlsplit(origin)
        if origin == "null" or parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
            return 403, f"Origin {origin!r} is not this server's ({host or 'no Host'}): cross-site requests are refused"
    if method.upper() in _STATE_CHANGING:
        ctype = headers.get("content-type", "").split(";")[0].strip().lower()
        allowed = tuple(content_types)
        if ctype not in allowed:
            return 415, (f"Content-Type {ctype or 'none'!r} is not accepted on {method.upper()}; "
                         f"use {' or '.join(allowed)}")

    return None


def add_token_option(parser: Any, flag: str, help: str) -> None:
    """``--FLAG TOKEN`` and ``--FLAG-file PATH`` on an argparse parser (a token on a command line is visible
    to every user of the machine: the file option is the one to use)."""
    dest = flag.lstrip("-").replace("-", "_")
    parser.add_argument(flag, default=None, dest=dest, help=f"{help} (prefer {flag}-file)")
    parser.add_argument(f"{flag}-file", default=None, dest=f"{dest}_file", metavar="PATH",
                        help=f"read the {flag.lstrip('-')} from this file")


def token_from_args(args: Any, flag: str) -> str | None:
    """The token of ``add_token_option(parser, flag, ...)``: the flag's, else its file's, else None."""
    dest = flag.lstrip("-").replace("-", "_")
    value, path = getattr(args, dest, None), getattr(args, f"{dest}_file", None)
    if value is not None and path is not None:
        raise ConfigError(f"give {flag} or {flag}-file, not both")
    return read_token_file(path, field=f"{flag}-file") if path is not None else value
