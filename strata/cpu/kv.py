"""The int8 KV cache's rows: one float32 scale a row (the GPU tier's int8 cache rounds alike)."""

from __future__ import annotations

import numpy as np


def quantize_kv_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [..., D] float32 -> (q [..., D] int8, d [...] float32): d = absmax / 127 per row,
    q = rint(x / d) (nearest, ties to even; a division, not a product with 1 / d, which would
    overflow for a subnormal d), clipped to +-127; d = 0 and q = 0 for a zero row. The int8 KV
    rows of both tiers; the GPU kernel does the same correctly rounded float32 operations."""
    x = np.asarray(x, np.float32)
    amax = np.max(np.abs(x), axis=-1)  # [...]
    d = (amax / np.float32(127)).astype(np.float32)
    r = np.zeros_like(x)
    np.divide(x, d[..., None], out=r, where=d[..., None] != 0)
    q = np.clip(np.rint(r), -127, 127).astype(np.int8)
    return q, d


def dequantize_kv_rows(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """(q [..., D] int8, d [...] float32) -> x [..., D] float32 = q * d."""
    return q.astype(np.float32) * d[..., None].astype(np.float32)
