"""STRCS1 router-score traces: per token and layer, the chosen ids and the whole score row,
written before any substitution, replayable offline (`strata car-estimate`).

Layout (little-endian): 8-byte magic b"STRCS1\\0\\0", then u32 n_layer, u32 n_expert, u32 k,
u32 header flags; then records of: u32 step (the token's position), u32 layer, u32 flags (bit 0:
a decode step, where CAR may act), i32 ids[k], f32 scores[n_expert] (softmax probabilities),
and where header flag bit 0 is set, f32 slack (the missed-expert jobs the CPU pool finished
inside the card's window at that layer: what `--car-mode slack` decides by). Traces written
before the slack field have header flags 0 and read as slack 0.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"STRCS1\0\0"
_HEADER = struct.Struct("<8sIIII")
HAS_SLACK = 1  # header flags bit 0: records end with f32 slack


@dataclass(frozen=True)
class TraceHeader:
    n_layer: int
    n_expert: int
    k: int
    flags: int = HAS_SLACK

    def record_dtype(self) -> np.dtype:
        fields = [
            ("step", "<u4"),
            ("layer", "<u4"),
            ("flags", "<u4"),
            ("ids", "<i4", (self.k,)),
            ("scores", "<f4", (self.n_expert,)),
        ]
        if self.flags & HAS_SLACK:
            fields.append(("slack", "<f4"))
        return np.dtype(fields)


class TraceWriter:
    """Appends records; one `write` per layer call with the rows of every token in it."""

    def __init__(self, path: str | os.PathLike, n_layer: int, n_expert: int, k: int):
        self.header = TraceHeader(n_layer, n_expert, k)
        self._rec = np.zeros(1, self.header.record_dtype())
        self.f = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.f.write(_HEADER.pack(MAGIC, n_layer, n_expert, k, HAS_SLACK))

    def write(
        self,
        step: int,
        layer: int,
        ids: np.ndarray,
        scores: np.ndarray,
        decode: bool = False,
        slack: float = 0.0,
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
        rec["slack"] = slack
        self.f.write(rec.tobytes())

    def close(self) -> None:
        self.f.close()


def read_trace(path: str | os.PathLike) -> tuple[TraceHeader, np.ndarray]:
    """The header and all records (a structured array: step, layer, flags, ids, scores, and
    slack where the header says so: `record_slack` reads it either way)."""
    p = Path(path)
    raw = p.read_bytes()
    if len(raw) < _HEADER.size or raw[:8] != MAGIC:
        raise ValueError(f"{p}: not an STRCS1 router-score trace")
    _, n_layer, n_expert, k, flags = _HEADER.unpack_from(raw)
    h = TraceHeader(n_layer, n_expert, k, flags)
    body = memoryview(raw)[_HEADER.size :]
    size = h.record_dtype().itemsize
    if len(body) % size:
        raise ValueError(f"{p}: trace is truncated ({len(body) % size} stray bytes at the end)")
    return h, np.frombuffer(body, dtype=h.record_dtype())


def record_slack(rec: np.ndarray) -> np.ndarray:
    """The slack of each record (0 for a trace written before the field)."""
    if rec.dtype.names and "slack" in rec.dtype.names:
        return rec["slack"]
    return np.zeros(rec.shape, np.float32)
