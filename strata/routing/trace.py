"""STRCS1 router-score traces: per token and layer, the chosen ids and the whole score row,
written before any substitution, replayable offline (`strata car-estimate`).

Layout (little-endian): 8-byte magic b"STRCS1\\0\\0", then u32 n_layer, u32 n_expert, u32 k,
u32 reserved; then records of: u32 step (the token's position), u32 layer, u32 flags (bit 0:
a decode step, where CAR may act), i32 ids[k], f32 scores[n_expert] (softmax probabilities).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"STRCS1\0\0"
_HEADER = struct.Struct("<8sIIII")


@dataclass(frozen=True)
class TraceHeader:
    n_layer: int
    n_expert: int
    k: int

    def record_dtype(self) -> np.dtype:
        return np.dtype(
            [
                ("step", "<u4"),
                ("layer", "<u4"),
                ("flags", "<u4"),
                ("ids", "<i4", (self.k,)),
                ("scores", "<f4", (self.n_expert,)),
            ]
        )


class TraceWriter:
    """Appends records; one `write` per layer call with the rows of every token in it."""

    def __init__(self, path: str | os.PathLike, n_layer: int, n_expert: int, k: int):
        self.header = TraceHeader(n_layer, n_expert, k)
        self._rec = np.zeros(1, self.header.record_dtype())
        self.f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.f.write(_HEADER.pack(MAGIC, n_layer, n_expert, k, 0))

    def write(
        self, step: int, layer: int, ids: np.ndarray, scores: np.ndarray, decode: bool = False
    ) -> None:
        """ids [T, K], scores [T, E]: token t is recorded as step `step + t`."""
        t = ids.shape[0]
        if self._rec.shape[0] < t:
            self._rec = np.zeros(t, self.header.record_dtype())
        rec = self._rec[:t]
        rec["step"] = np.arange(step, step + t)
        rec["layer"] = layer
        rec["flags"] = int(decode)
        rec["ids"] = ids
        rec["scores"] = scores
        self.f.write(rec.tobytes())

    def close(self) -> None:
        self.f.close()


def read_trace(path: str | os.PathLike) -> tuple[TraceHeader, np.ndarray]:
    """The header and all records (a structured array: step, layer, flags, ids, scores)."""
    p = Path(path)
    raw = p.read_bytes()
    if len(raw) < _HEADER.size or raw[:8] != MAGIC:
        raise ValueError(f"{p}: not an STRCS1 router-score trace")
    _, n_layer, n_expert, k, _ = _HEADER.unpack_from(raw)
    h = TraceHeader(n_layer, n_expert, k)
    body = memoryview(raw)[_HEADER.size :]
    size = h.record_dtype().itemsize
    if len(body) % size:
        raise ValueError(f"{p}: trace is truncated ({len(body) % size} stray bytes at the end)")
    return h, np.frombuffer(body, dtype=h.record_dtype())
