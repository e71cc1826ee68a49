"""A protobuf-aware mutator in Python (the differential test's; libFuzzer's is proto_mutator.c).

`mutants(body, rng, n)`: n variants of one OTLP body, each from one to three changes to a field of
its wire-format tree (a length-delimited field whose payload parses whole is a message, else bytes),
written back with every enclosing length right: drop a field, repeat it, copy another field next to
it, overlong tag or length varints (2-10 bytes), edge varint values, another field number or wire type,
flipped or inserted bytes in a payload, a field wrapped in a message of its own; and a few plain
truncations and bit flips of the whole body.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

__all__ = ["mutants", "parse", "serialize"]

_EDGES = [0, 1, 2, 0x7F, 0x80, 0x3FFF, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64 - 2**31]


@dataclass
class Field:
    number: int
    wire_type: int
    value: int = 0  # varint
    raw: bytes = b""  # fixed32 / fixed64 / bytes payload
    children: list["Field"] | None = None  # a message payload
    tag_pad: int = 0  # bytes past the shortest encoding (an overlong varint)
    len_pad: int = 0
    value_pad: int = 0


def _varint(data: bytes, i: int) -> tuple[int, int, int]:
    """(value, the index after it, how many bytes longer than the shortest encoding it is)."""
    v = shift = 0
    for width in range(1, 11):
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i, width - len(_put_varint(v))
    raise ValueError("varint too long")


def parse(data: bytes, depth: int = 0) -> list[Field]:
    """The fields of ``data``; ValueError if it is not a message."""
    out, i = [], 0
    while i < len(data):
        tag, i, tag_pad = _varint(data, i)
        number, wt = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field 0")
        f = Field(number, wt, tag_pad=tag_pad)
        if wt == 0:
            f.value, i, f.value_pad = _varint(data, i)
        elif wt in (1, 5):
            width = 8 if wt == 1 else 4
            if i + width > len(data):
                raise ValueError("truncated fixed")
            f.raw, i = data[i:i + width], i + width
        elif wt == 2:
            n, i, f.len_pad = _varint(data, i)
            if i + n > len(data):
                raise ValueError("length past the end")
            f.raw, i = data[i:i + n], i + n
            if f.raw and depth < 24:
                try:
                    f.children = parse(f.raw, depth + 1)
                except ValueError:
                    f.children = None
        else:
            raise ValueError(f"wire type {wt}")
        out.append(f)
    return out


def _put_varint(v: int, pad: int = 0) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append(v & 0x7F | 0x80)
        v >>= 7
    if not pad:
        return bytes(out + bytes([v]))
    return bytes(out + bytes([v | 0x80]) + b"\x80" * (pad - 1) + b"\x00")


def serialize(fields: list[Field]) -> bytes:
    out = bytearray()
    for f in fields:
        out += _put_varint(f.number << 3 | f.wire_type, f.tag_pad)
        if f.wire_type == 0:
            out += _put_varint(f.value, f.value_pad)
        elif f.wire_type == 2:
            payload = serialize(f.children) if f.children is not None else f.raw
            out += _put_varint(len(payload), f.len_pad) + payload
        else:
            out += f.raw
    return bytes(out)


def _all(fields: list[Field], holder: list) -> None:
    for i, f in enumerate(fields):
        holder.append((fields, i))
        if f.children is not None:
            _all(f.children, holder)


def _copy(f: Field) -> Field:
    return replace(f, children=None if f.children is None else [_copy(c) for c in f.children])


def _change(fields: list[Field], rng: random.Random) -> None:
    places: list = []
    _all(fields, places)
    siblings, i = rng.choice(places)
    f = siblings[i]
    op = rng.randrange(9)
    if op == 0:
        del siblings[i]
    elif op in (1, 2):  # repeat it, or copy any field (its subtree) beside it
        holder, j = rng.choice(places)
        siblings.insert(i + 1, _copy(f if op == 1 else holder[j]))
    elif op == 3:
        pad = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9])
        if f.wire_type == 2 and rng.random() < 0.5:
            f.len_pad = pad
        else:
            f.tag_pad = pad
    elif op == 4 and f.wire_type == 0:
        f.value = rng.choice(_EDGES) if rng.random() < 0.8 else max(0, f.value + rng.randrange(-2, 3))
    elif op == 5:
        f.number = rng.randrange(1, 21) if rng.random() < 0.7 else f.number + 1
    elif op == 6:
        f.wire_type = rng.choice([0, 1, 2, 5])
        f.raw = rng.randbytes(8 if f.wire_type == 1 else 4) if f.wire_type in (1, 5) else f.raw
        f.children = f.children if f.wire_type == 2 else None
    elif op == 7 and f.wire_type == 2 and f.children is None:
        raw = bytearray(f.raw)
        if raw and rng.random() < 0.5:
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        else:
            raw[rng.randrange(len(raw) + 1):0] = rng.randbytes(rng.randrange(1, 4))
        f.raw = bytes(raw)
    elif op == 8:
        siblings[i] = Field(f.number, 2, children=[_copy(f)])


def mutants(body: bytes, rng: random.Random, n: int) -> list[bytes]:
    """``n`` mutated variants of ``body`` (a few whole-body truncations and flips among them)."""
    try:
        tree = parse(body)
    except ValueError:
        tree = None
    out = []
    for _ in range(n):
        if tree is None or rng.random() < 0.1:
            flipped = bytearray(body)
            if flipped and rng.random() < 0.5:
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            elif flipped:
                del flipped[rng.randrange(len(flipped)):]
            out.append(bytes(flipped))
            continue
        fields = [_copy(f) for f in tree]
        for _ in range(rng.choice([1, 1, 2, 3])):
            if fields:
                _change(fields, rng)
        out.append(serialize(fields))
    return out
