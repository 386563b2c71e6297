"""MXFP4 weights (blocks of 32, 17 bytes) against a Q8_0 activation: portable kernel.

A block is one E8M0 byte e and 16 bytes of E2M1 codes (weight j in the low nibble of byte j,
weight j + 16 in its high nibble). ggml keeps the E2M1 values doubled as small integers
(kvalues_mxfp4: 0, +-1, +-2, +-3, +-4, +-6, +-8, +-12) and halves the scale to match
(GGML_E8M0_TO_FP32_HALF: 2**(e - 128), as float32, subnormal for e < 2), so a block's dot is an
integer sum times one float, as ggml_vec_dot_mxfp4_q8_0: float32(d_x * e8m0_half(e)) * sum.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.common import bits_f32
from strata.cpu.kernels.reference import blocks
from strata.cpu.kernels.tables import KVALUES_MXFP4

BB = 17  # block bytes
_KV = KVALUES_MXFP4


@njit(cache=True, inline="always")
def e8m0_half(e):
    """GGML_E8M0_TO_FP32_HALF: 2**(e - 128) as float32 for the E8M0 byte e (0..255)."""
    u = np.uint32(e)
    if u < 2:
        return bits_f32(np.uint32(0x00200000) << u)
    return bits_f32((u - np.uint32(1)) << np.uint32(23))


@njit(cache=True)
def dot_mxfp4(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // BB):
        o = b * BB
        s = 0
        for j in range(16):
            q = w[r, o + 1 + j]
            s += _KV[q & 15] * xq[a, 32 * b + j]
            s += _KV[q >> 4] * xq[a, 32 * b + 16 + j]
        acc += np.float32(xd[a, b] * e8m0_half(w[r, o])) * np.float32(s)
    return acc


def e8m0_half_np(e: np.ndarray) -> np.ndarray:
    """`e8m0_half` of a uint8 array, as float64 (exact)."""
    k = e.astype(np.int64)
    return np.ldexp(1.0, np.maximum(k, 1) - 128) * np.where(k == 0, 0.5, 1.0)


def terms(w: np.ndarray):
    bl = blocks(w, BB)
    qs = bl[..., 1:]  # [R, nb, 16]
    q = np.concatenate([qs & 15, qs >> 4], axis=-1)  # [R, nb, 32]: weights 0..15, 16..31
    sw = KVALUES_MXFP4.astype(np.int64)[q].reshape(w.shape[0], -1)
    return [(e8m0_half_np(bl[..., 0]), sw, 32)]
