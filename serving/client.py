"""`PolicyClient`: a running spanrl policy server seen over HTTP (httpx only, no torch).

The one client of a server this process did not start: the online trainer (``spanrl train --online``)
and the Trainer's pool of other servers (``serving.urls``) read its policy version from ``GET /health``
and push weights through ``POST /v1/weights/reload`` (the server must see the folder: same machine or a
shared file system) or, whole weights, in the body of ``POST /v1/weights/load`` (no folder). Both routes need
the server's ``--admin-token``: ``token``, else
``SPANRL_POLICY_ADMIN_TOKEN`` (read at each call). Every failure is a `ServingError` naming the server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from spanrl import env
from spanrl.errors import ServingError

__all__ = ["PolicyClient"]

_HEALTH_TIMEOUT_S = 30.0
# What to do when the reload route refuses (serving/app.py): the status -> the fix.
_RELOAD_FIXES = {
    403: "start `spanrl serve` with --admin-token-file FILE and --checkpoint-root DIR, DIR holding the trainer's "
         "output_dir",
    401: "give the trainer the server's admin token: SPANRL_POLICY_ADMIN_TOKEN=$(cat FILE), FILE the server's "
         "--admin-token-file",
    400: "the trainer's output_dir must lie under the server's --checkpoint-root, on a file system the server sees",
}
_RELOAD_TIMEOUT_S = 600.0  # a reload loads the whole model


_LOAD = "/v1/weights/load"
_LOAD_FIXES = {403: "start `spanrl serve` with --admin-token-file FILE", 401: _RELOAD_FIXES[401],
               413: "raise the server's --max-weights-bytes to hold the model's weights"}


class PolicyClient:
    """The policy server at ``url`` (its root, ``http://host:port``)."""

    def __init__(self, url: str, *, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._token = token

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` document (``policy_version``, ``model``, ...)."""
        return self._call("GET", "/health", None, _HEALTH_TIMEOUT_S)

    def version(self) -> int:
        """The policy version the server serves now (0 for a fresh server)."""
        return int(self._field(self.health(), "/health"))

    def reload(self, path: str | Path, adapter: str | None = None) -> int:
        """Ask the server to load the HF folder ``path`` (with ``adapter``: that LoRA adapter's PEFT folder);
        the new policy version (of that adapter)."""
        body = {"path": str(Path(path).resolve()), **({"model": adapter} if adapter else {})}
        doc = self._call("POST", "/v1/weights/reload", body, _RELOAD_TIMEOUT_S, fixes=_RELOAD_FIXES)
        return int(self._field(doc, "/v1/weights/reload"))

    def push(self, data: bytes) -> int:
        """Send whole weights, ``data`` the bytes of one safetensors file, in the body of ``POST /v1/weights/load``
        (loaded in the server's memory: no folder on either side); the new policy version."""
        token = self._token or env.get_str(env.SPANRL_POLICY_ADMIN_TOKEN)
        headers = {"content-type": "application/octet-stream"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        try:
            reply = httpx.post(self.url + _LOAD, content=data, headers=headers, timeout=_RELOAD_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise ServingError(f"no spanrl policy server answers at {self.url}: {exc}") from None
        return int(self._field(self._doc(reply, _LOAD, _LOAD_FIXES), _LOAD))

    def check_reload(self, folder: str | Path) -> None:
        """Ask the server whether it would reload from under ``folder`` (a dry run: nothing is loaded); a
        `ServingError` with the server's reason and the fix when it would not."""
        body = {"path": str(Path(folder).resolve()), "dry_run": True}
        self._call("POST", "/v1/weights/reload", body, _HEALTH_TIMEOUT_S, fixes=_RELOAD_FIXES)

    def _call(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float,
              fixes: dict[int, str] | None = None) -> dict[str, Any]:
        token = self._token or env.get_str(env.SPANRL_POLICY_ADMIN_TOKEN)
        headers = {"authorization": f"Bearer {token}"} if token and body is not None else None
        try:
            reply = httpx.request(method, self.url + path, json=body, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise ServingError(f"no spanrl policy server answers at {self.url}: {exc}") from None
        return self._doc(reply, path, fixes)

    def _doc(self, reply: httpx.Response, path: str, fixes: dict[int, str] | None) -> dict[str, Any]:
        if reply.status_code != 200:
            fix = (fixes or {}).get(reply.status_code)
            raise ServingError(f"policy server {self.url}{path} answered {reply.status_code}: {_reason(reply)}"
                               + (f"; to fix: {fix}" if fix else ""))
        try:
            doc = reply.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise ServingError(f"policy server {self.url}{path} answered no JSON object: {reply.text[:200]!r}")
        return doc

    def _field(self, doc: dict[str, Any], path: str) -> Any:
        value = doc.get("policy_version")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ServingError(f"policy server {self.url}{path} answered no policy_version: {str(doc)[:200]}")
        return value


def _reason(reply: httpx.Response) -> str:
    """The message of an OpenAI-style error document (``{"error": {"message": ...}}``), else the body's start."""
    try:
        message = reply.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return reply.text[:500]
    return str(message)
