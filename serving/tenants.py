"""Who is calling, and which rollouts are theirs: API keys name tenants, and the first tenant to name a rollout,
conversation or trace id owns it.

A client sends its key as OpenAI's clients do, ``Authorization: Bearer <key>`` (``OPENAI_API_KEY``), and the server
maps it to a tenant (``ServerConfig.api_keys``; ``spanrl serve --api-key-file`` with ``key tenant`` lines, or vLLM's
one ``--api-key``). Every ``/v1`` route then needs a known key (401 without one; ``/health`` stays open). A request's
rollout id (path or ``x-spanrl-rollout-id``), conversation id (``metadata.conversation_id`` ...) and trace id (its
``traceparent``) are bound to its tenant on first use, in memory; a request of another tenant naming one is refused
with 403, so its span never joins that rollout (the store attributes by exactly these ids, store/views.sql).

With no keys every caller is one anonymous tenant, as before keys existed: allowed on loopback only, said in one line
at start (`PolicyServer`); bound beyond loopback the server refuses to start (`ServerConfig.validate`).
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spanrl import semconv
from spanrl.errors import ConfigError
from spanrl.serving.errors import RequestError

__all__ = ["MAX_BOUND_IDS", "Tenants", "check_api_keys", "read_api_key_file"]

_logger = logging.getLogger(__name__)

MAX_BOUND_IDS = 1_000_000
"""Ids remembered (about 150 bytes each); past it the least recently used is forgotten, and may be bound again."""
_ID_KINDS = ((semconv.ROLLOUT_ID, "rollout"), (semconv.GEN_AI_CONVERSATION_ID, "conversation"))


def read_api_key_file(path: str | Path) -> dict[str, str]:
    """``key tenant`` per line (``#`` comments and blank lines skipped); a file of one bare key: tenant ``default``.
    `ConfigError` naming the file and line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        if Path(path).stat().st_mode & 0o077:
            _logger.warning("api_key_file %s can be read by other users of this machine: chmod 600 it", path)
    except OSError as exc:
        raise ConfigError(f"api_key_file: cannot read {str(path)!r}: {exc.strerror or exc}") from None
    keys: dict[str, str] = {}
    rows = [(n, line.split()) for n, line in enumerate(lines, 1) if line.strip() and not line.lstrip().startswith("#")]
    for n, parts in rows:
        if len(parts) == 1 and len(rows) == 1:
            parts = [parts[0], "default"]
        if len(parts) != 2:
            raise ConfigError(f"api_key_file {str(path)!r} line {n}: expected 'KEY TENANT', got {len(parts)} fields")
        if parts[0] in keys:
            raise ConfigError(f"api_key_file {str(path)!r} line {n}: a key listed twice")
        keys[parts[0]] = parts[1]
    if not keys:
        raise ConfigError(f"api_key_file {str(path)!r} holds no key")
    return keys


def check_api_keys(keys: Any) -> None:
    """`ConfigError` unless ``keys`` maps non-empty keys without whitespace to non-empty tenant names."""
    if not isinstance(keys, Mapping):
        raise ConfigError(f"api_keys must map API keys to tenant names, got {type(keys).__name__}")
    for key, tenant in keys.items():
        if not isinstance(key, str) or not key or any(c.isspace() for c in key):
            raise ConfigError("api_keys: every key must be a non-empty string without whitespace")
        if not isinstance(tenant, str) or not tenant or any(c.isspace() for c in tenant):
            raise ConfigError(f"api_keys: tenant names must be non-empty strings without whitespace, got {tenant!r}")


def _trace_id(traceparent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``), lowercase; None if absent or bad."""
    parts = (traceparent or "").strip().lower().split("-")
    if len(parts) >= 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        return parts[1]
    return None


class Tenants:
    """API keys -> tenants, and the tenant each id is bound to. Thread-safe."""

    def __init__(self, api_keys: Mapping[str, str] | None, *, max_ids: int = MAX_BOUND_IDS) -> None:
        self._keys = [(key.encode(), tenant) for key, tenant in (api_keys or {}).items()]
        self._owners: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._max_ids = max_ids
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether keys are configured (else every caller is one anonymous tenant and nothing is bound)."""
        return bool(self._keys)

    def tenant_of(self, authorization: str | None) -> str | None:
        """The tenant of the ``Authorization`` header's key; None without keys configured; 401 for a missing or
        unknown key (every key is compared in constant time)."""
        if not self._keys:
            return None
        scheme, _, value = (authorization or "").partition(" ")
        given = value.strip().encode() if scheme.lower() == "bearer" else b""
        found = None
        for key, tenant in self._keys:
            if hmac.compare_digest(given, key):
                found = tenant
        if found is None:
            raise RequestError("missing or unknown API key: send 'Authorization: Bearer <key>' (OPENAI_API_KEY) "
                               "with a key this server was started with (--api-key-file)", status=401,
                               type="authentication_error", code="invalid_api_key")
        return found

    def bind(self, tenant: str | None, rollout: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        """Bind the request's rollout, conversation and trace ids to ``tenant`` (first use binds); 403 naming
        the first id another tenant holds. Nothing is bound for None (no keys configured)."""
        if tenant is None:
            return
        ids = [(kind, str(rollout[attr])) for attr, kind in _ID_KINDS if rollout.get(attr)]
        trace = _trace_id(headers.get("traceparent"))
        if trace is not None:
            ids.append(("trace", trace))
        with self._lock:
            for kind, value in ids:
                owner = self._owners.get((kind, value))
                if owner is not None and owner != tenant:
                    raise RequestError(
                        f"{kind} {value!r} belongs to another tenant: an API key may name only the rollouts, "
                        f"conversations and traces its own tenant opened", status=403, type="permission_error",
                        param=f"{kind}_id", code="foreign_" + kind)
            for key in ((kind, value) for kind, value in ids):
                self._owners[key] = tenant
                self._owners.move_to_end(key)
            while len(self._owners) > self._max_ids:
                self._owners.popitem(last=False)
