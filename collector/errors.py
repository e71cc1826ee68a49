"""Collector errors, split as OTLP splits them: *retryable* (gRPC UNAVAILABLE / HTTP 503 with
Retry-After: the sender keeps the data and tries again) and *permanent* (INVALID_ARGUMENT / 400: the
data is bad and retrying cannot help). Receivers map each class to its status.

    CollectorError (spanrl.errors)
    ├── RetryableError          queue full, memory budget full, shutting down, store write failed
    │   └── StoreFailedError    DuckDB invalidated the store and it could not be reopened
    ├── PermanentError          malformed body, wrong content type, nesting past MAX_NESTING, a decoder bug
    │   └── PayloadTooLargeError   body over max_request_bytes (HTTP 413; gRPC RESOURCE_EXHAUSTED), or its
    │                              decoded form over the whole memory budget (413; INVALID_ARGUMENT)
    └── UnauthenticatedError    missing or wrong bearer token (UNAUTHENTICATED / 401)
"""

from __future__ import annotations

from spanrl.errors import CollectorError

__all__ = ["PayloadTooLargeError", "PermanentError", "RetryableError", "StoreFailedError", "UnauthenticatedError"]

DEFAULT_RETRY_AFTER_S = 1


class RetryableError(CollectorError):
    """The request was not stored but may succeed later; ``retry_after_s`` is the hint sent back."""

    def __init__(self, message: str, *, retry_after_s: int = DEFAULT_RETRY_AFTER_S) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StoreFailedError(RetryableError):
    """The store failed and could not be reopened: nothing more is stored until a restart."""


class PermanentError(CollectorError):
    """The request is bad; nothing of it (or of the named spans) is stored, retrying cannot help."""


class PayloadTooLargeError(PermanentError):
    """The request body is larger than the configured limit."""


class UnauthenticatedError(CollectorError):
    """The request lacks the configured bearer token."""
