"""Errors a request can get, mapped to OpenAI-style JSON error bodies."""

from __future__ import annotations

from typing import Any

from spanrl.errors import ServingError

__all__ = ["RequestError", "error_body"]


class RequestError(ServingError):
    """A request the server refuses: HTTP ``status`` with an OpenAI-style error body naming ``param``."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        code: str | None = None,
        type: str = "invalid_request_error",  # noqa: A002 - the OpenAI field name
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.type = type


def error_body(
    message: str, *, type: str, param: str | None = None, code: str | None = None  # noqa: A002
) -> dict[str, Any]:

    """``{"error": {"message", "type", "param", "code"}}`` as the OpenAI API returns it."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
