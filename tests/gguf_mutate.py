"""Test utility: where each field of a GGUF header lies, and seeded mutations of those bytes.

`header_fields(data)` walks a valid header and returns one `Field` per value it holds (counts,
lengths, value types, scalars, tensor dims, types and offsets) with its byte span; `mutants`
derives a fixed-seed stream of mutated headers from them, aimed at the values a reader divides by,
allocates by or loops over, plus plain byte flips. The walker is independent of Strata's reader.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGMLQuantizationType, GGUFValueType

_SIZES = {
    GGUFValueType.UINT8: 1,
    GGUFValueType.INT8: 1,
    GGUFValueType.UINT16: 2,
    GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4,
    GGUFValueType.INT32: 4,
    GGUFValueType.FLOAT32: 4,
    GGUFValueType.BOOL: 1,
    GGUFValueType.UINT64: 8,
    GGUFValueType.INT64: 8,
    GGUFValueType.FLOAT64: 8,
}


@dataclass(frozen=True)
class Field:
    kind: str  # n_tensors | n_kv | strlen | vtype | scalar | float | arr_type | arr_len |
    # n_dims | ne | ggml_type | offset
    pos: int
    size: int
    label: str  # the key or tensor it belongs to


def header_fields(data: bytes) -> tuple[list[Field], int]:
    """The fields of the header of `data` (a valid GGUF) and the header's end."""
    out: list[Field] = []
    pos = 8

    def u(fmt: str, kind: str, label: str) -> int:
        nonlocal pos
        size = struct.calcsize(fmt)
        out.append(Field(kind, pos, size, label))
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += size
        return v

    def string(label: str) -> str:
        nonlocal pos
        n = u("<Q", "strlen", label)
        s = data[pos : pos + n].decode()
        pos += n
        return s

    def value(vt: int, label: str) -> None:
        nonlocal pos
        vt = GGUFValueType(vt)
        if vt == GGUFValueType.STRING:
            string(label)
        elif vt == GGUFValueType.ARRAY:
            sub = u("<I", "arr_type", label)
            n = u("<Q", "arr_len", label)
            for _ in range(n):
                value(sub, label)
        elif vt in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            out.append(Field("float", pos, _SIZES[vt], label))
            pos += _SIZES[vt]
        else:
            out.append(Field("scalar", pos, _SIZES[vt], label))
            pos += _SIZES[vt]

    n_tensors = u("<Q", "n_tensors", "")
    n_kv = u("<Q", "n_kv", "")
    for _ in range(n_kv):
        key = string("key")
        vt = u("<I", "vtype", key)
        value(vt, key)
    for _ in range(n_tensors):
        name = string("tensor")
        nd = u("<I", "n_dims", name)
        for _ in range(nd):
            u("<Q", "ne", name)
        u("<I", "ggml_type", name)
        u("<Q", "offset", name)
    return out, pos


_INT_VALUES = (0, 1, 2, 3, 7, 255, 2**15, 2**31 - 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1)
_FLOATS = (float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 1e30, 1e-30)
_TYPES = [int(t) for t in GGMLQuantizationType] + [4, 5, 40, 2**31, 2**32 - 1]


def _put_int(buf: bytearray, f: Field, v: int) -> None:
    buf[f.pos : f.pos + f.size] = (v % (1 << (8 * f.size))).to_bytes(f.size, "little")


def _mutate_field(buf: bytearray, f: Field, rng: np.random.Generator) -> None:
    """Change the field's bytes (never a no-op: an unchanged value flips one bit instead)."""
    before = bytes(buf[f.pos : f.pos + f.size])
    _set_field(buf, f, rng)
    if buf[f.pos : f.pos + f.size] == before:
        buf[f.pos + int(rng.integers(f.size))] ^= 1 << int(rng.integers(8))


def _set_field(buf: bytearray, f: Field, rng: np.random.Generator) -> None:
    old = int.from_bytes(buf[f.pos : f.pos + f.size], "little")
    r = rng.random()
    if f.kind == "float" and r < 0.7:
        x = _FLOATS[rng.integers(len(_FLOATS))]
        buf[f.pos : f.pos + f.size] = struct.pack("<f" if f.size == 4 else "<d", x)
    elif f.kind in ("ggml_type", "vtype", "arr_type") and r < 0.7:
        _put_int(buf, f, int(rng.choice(_TYPES if f.kind == "ggml_type" else range(16))))
    elif f.kind == "offset" and r < 0.6:
        _put_int(buf, f, old + int(rng.choice([-64, -32, -1, 1, 2, 31, 32, 4096])))
    elif r < 0.55:
        _put_int(buf, f, _INT_VALUES[rng.integers(len(_INT_VALUES))])
    elif r < 0.75:
        _put_int(buf, f, old + int(rng.integers(-3, 4)))
    elif r < 0.9:
        _put_int(buf, f, old * int(rng.choice([2, 16, 1 << 20])))
    else:
        i = f.pos + int(rng.integers(f.size))
        buf[i] ^= 1 << int(rng.integers(8))


def mutants(data: bytes, n: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """n mutated copies of the GGUF `data` (fixed seed): (what was changed, the new bytes).

    Most change one to three header fields, chosen by kind so that counts, types, offsets and
    floats are all hit; some flip random header bytes; only the header is ever changed."""
    fields, end = header_fields(data)
    by_kind: dict[str, list[Field]] = {}
    for f in fields:
        by_kind.setdefault(f.kind, []).append(f)
    kinds = sorted(by_kind)
    rng = np.random.default_rng(seed)
    for _ in range(n):
        buf = bytearray(data)
        if rng.random() < 0.1:
            for _ in range(int(rng.integers(1, 9))):
                i = int(rng.integers(8, end))
                buf[i] ^= 1 << int(rng.integers(8))
            yield "bytes", bytes(buf)
            continue
        what = []
        for _ in range(int(rng.integers(1, 4))):
            group = by_kind[kinds[rng.integers(len(kinds))]]
            f = group[rng.integers(len(group))]
            _mutate_field(buf, f, rng)
            what.append(f"{f.kind}:{f.label}")
        yield " ".join(what), bytes(buf)


def with_field(data: bytes, label: str, kind: str, value: int | float, nth: int = 0) -> bytes:
    """`data` with the nth field of this kind and label (a key or tensor name) set to value."""
    fields, _ = header_fields(data)
    f = [f for f in fields if f.label == label and f.kind == kind][nth]
    buf = bytearray(data)
    if kind == "float":
        buf[f.pos : f.pos + f.size] = struct.pack("<f" if f.size == 4 else "<d", value)
    else:
        _put_int(buf, f, int(value))
    return bytes(buf)


def nested_array_gguf(depth: int) -> bytes:
    """A GGUF header whose one key holds arrays nested `depth` deep (no tensors)."""
    arr = int(GGUFValueType.ARRAY)
    out = struct.pack("<IIQQ", 0x46554747, 3, 0, 1) + struct.pack("<Q", 1) + b"x"
    out += struct.pack("<I", arr)
    out += struct.pack("<IQ", arr, 1) * (depth - 1) + struct.pack(
        "<IQ", int(GGUFValueType.UINT8), 0
    )
    return out
