"""The token-array codec of the wire contract, defined once (``docs/conventions.md``, section on exact
tokens): token ids and log-probs may travel as a string holding base64 of little-endian int32 (ids) or
float32 (log-probs). The policy server encodes; the collector and the tests decode. NumPy only, so the
collector, store and agents import it without the OTel SDK or torch.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import numpy as np

__all__ = [
    "FLOAT32",
    "INT32",
    "CodecError",
    "decode_float32",
    "decode_int32",
    "encode_float32",
    "encode_int32",
    "from_base64",
    "from_bytes",
]

INT32 = np.dtype("<i4")
"""Token ids: little-endian int32."""
FLOAT32 = np.dtype("<f4")
"""Log-probs: little-endian float32."""
_WIDTH = 4  # bytes per value of either type


class CodecError(ValueError):
    """The text or bytes are not a token array (the message says why)."""


def encode_int32(values: Sequence[int]) -> str:
    """Base64 of the values as little-endian int32."""
    return base64.b64encode(np.asarray(values, dtype=INT32).tobytes()).decode("ascii")


def encode_float32(values: Sequence[float]) -> str:
    """Base64 of the values as little-endian float32."""
    return base64.b64encode(np.asarray(values, dtype=FLOAT32).tobytes()).decode("ascii")


def from_bytes(raw: bytes, dtype: np.dtype) -> np.ndarray:
    """Raw little-endian 32-bit values -> a read-only array of ``dtype``; CodecError if ragged."""
    if len(raw) % _WIDTH:
        raise CodecError(f"holds {len(raw)} bytes, not a multiple of {_WIDTH} (little-endian 32-bit values)")
    return np.frombuffer(raw, dtype=dtype)


def from_base64(text: str, dtype: np.dtype) -> np.ndarray:
    """Base64 text -> an array of ``dtype``; CodecError if it is not base64 of whole 32-bit values."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CodecError(f"is a string but not valid base64 ({exc})") from None
    return from_bytes(raw, dtype)


def decode_int32(text: str) -> list[int]:
    """Inverse of :func:`encode_int32`."""
    return from_base64(text, INT32).tolist()


def decode_float32(text: str) -> list[float]:
    """Inverse of :func:`encode_float32`."""
    return from_base64(text, FLOAT32).tolist()
