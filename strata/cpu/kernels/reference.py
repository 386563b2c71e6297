"""The NumPy reference every quantized kernel is held to: ggml's integer dot, written plainly.

A format's dequantized weights are a sum of terms `F[r, b] * SW[r, i]`: a float factor per block
b (the f16 scales, times a constant) and an integer per weight (sub-block scale times quant).
The dot with a Q8 activation (quants xq, block scales xd) is then

    y[t, r] = sum_term sum_b xd[t, b] * F[r, b] * sum_{i in b} SW[r, i] * xq[t, i]

with the inner sum exact in integers, as ggml's vec_dot computes it. Each kernel module provides
`terms(w_bytes) -> [(F, SW, block)]`; tests check F * SW against `gguf.quants.dequantize` and the
Numba kernel against `ref_gemv`.
"""

from __future__ import annotations

import numpy as np


def ref_gemv(terms, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """y [n, R] float64 from `terms` [(F [R, nb], SW [R, n_in] int, block)] and xq [n, n_in]."""
    y = 0.0
    for f, sw, blk in terms:
        r, n_in = sw.shape
        nb = n_in // blk
        isum = np.einsum(
            "rbi,tbi->trb",
            sw.reshape(r, nb, blk).astype(np.int64),
            xq.reshape(xq.shape[0], nb, blk).astype(np.int64),
        )  # [n, R, nb] exact
        y = y + np.einsum(
            "trb,rb,tb->tr",
            isum.astype(np.float64),
            f.astype(np.float64),
            xd[:, :nb].astype(np.float64),
        )
    return y


def dequant_terms(terms) -> np.ndarray:
    """The dequantized matrix [R, n_in] float64 the terms stand for."""
    out = 0.0
    for f, sw, blk in terms:
        out = out + np.repeat(f.astype(np.float64), blk, axis=1) * sw
    return out


def f16(b: np.ndarray) -> np.ndarray:
    """Little-endian f16 from the last axis of uint8 pairs, as float64."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float64)


def blocks(w: np.ndarray, block_bytes: int) -> np.ndarray:
    """w [R, row_bytes] uint8 -> [R, nb, block_bytes]."""
    return w.reshape(w.shape[0], -1, block_bytes)
