"""MXFP4 weights (blocks of 32, 17 bytes) against a Q8_0 activation: portable kernel.

A block is one E8M0 byte e and 16 bytes of E2M1 codes (weight j in the low nibble of byte j,
weight j + 16 in its high nibble). ggml keeps the E2M1 values doubled as small integers
(kvalues_mxfp4: 0, +-1, +-2, +-3, +-4, +-6, +-8, +-12) and halves the scale to match
(GGML_E8M0_TO_FP32_HALF: 2**(e - 128), as float32, subnormal for e < 2), so a block's dot is an
integer sum times one float, as ggml_vec_dot_mxfp4_q8_0: float32(d_x * e8m0_half(e)) * sum.

LANES: block k of every 8-block group (256 weights) is added into accumulator k % 8, and the
eight accumulators are summed by halves at the row's end (`group_sum`), the tail blocks then one
at a time; not added to one total block by block as ggml's scalar loop does (its AVX2 loop has an
order of its own too): the SIMD kernel keeps the eight accumulators in one vector, one vector add
per 256 weights and no horizontal sum in the loop.
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


@njit(cache=True, inline="always")
def block_term(w, r, o, xq, a, xo, d):
    """float32(d * e8m0_half(e)) * float32(sum w x) of the block at w[r, o:o+17]."""
    s = 0
    for j in range(16):
        q = w[r, o + 1 + j]
        s += _KV[q & 15] * xq[a, xo + j]
        s += _KV[q >> 4] * xq[a, xo + 16 + j]
    return np.float32(d * e8m0_half(w[r, o])) * np.float32(s)


@njit(cache=True, inline="always")
def group_sum(p):
    """The 8 accumulators p summed by halves: ((p0 + p4) + (p2 + p6)) + ((p1 + p5) + (p3 + p7))
    (a vector's halves added, twice, then its two lanes)."""
    h0, h1, h2, h3 = p[0] + p[4], p[1] + p[5], p[2] + p[6], p[3] + p[7]
    return (h0 + h2) + (h1 + h3)


@njit(cache=True)
def dot_mxfp4(w, r, xq, xd, xb, x8, xf, a):
    nb = w.shape[1] // BB
    p = np.zeros(8, np.float32)
    for g in range(0, nb - 7, 8):  # groups of 8 blocks: block g + k into accumulator k (LANES)
        for k in range(8):
            p[k] += block_term(w, r, (g + k) * BB, xq, a, 32 * (g + k), xd[a, g + k])
    acc = group_sum(p)
    for b in range(nb - nb % 8, nb):  # the blocks past the last group, one at a time
        acc += block_term(w, r, b * BB, xq, a, 32 * b, xd[a, b])
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
