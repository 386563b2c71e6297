"""IQ1_M weights (56 bytes per 256) against a Q8_K activation: portable kernel and reference.

32 groups of 8 weights: an 11-bit index (qs byte + 3 bits of a qh nibble) into the ternary
iq1s grid, and a delta sign (bit 3 of the nibble); 16 three-bit scales (one per 16 weights) and
the f16 d spread over the top nibbles of the four u16 scale words. w = d (2 ls + 1) (g + delta),
delta = +-1/8; in integers (times 8): 8 sum(g x) + delta8 sum(x) per group, with sum(x) from x8.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.common import f16_bits_to_f32
from strata.cpu.kernels.reference import blocks
from strata.cpu.kernels.tables import IQ1S_GRID

BB = 56
_G1 = IQ1S_GRID


@njit(cache=True, inline="always")
def iq1m_d(w, r, o):
    """The f16 super-block scale of the IQ1_M block at w[r, o:o+56], as float32."""
    s0 = np.uint16(w[r, o + 48]) | (np.uint16(w[r, o + 49]) << 8)
    s1 = np.uint16(w[r, o + 50]) | (np.uint16(w[r, o + 51]) << 8)
    s2 = np.uint16(w[r, o + 52]) | (np.uint16(w[r, o + 53]) << 8)
    s3 = np.uint16(w[r, o + 54]) | (np.uint16(w[r, o + 55]) << 8)
    bits = (s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000)
    return f16_bits_to_f32(bits)


@njit(cache=True)
def dot_iq1_m(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // BB):
        o = b * BB
        xo = b * 256
        isum = 0
        for s in range(16):  # 16 weights: groups 2s, 2s+1
            wo = o + 48 + 2 * (s // 4)
            word = np.int32(w[r, wo]) | (np.int32(w[r, wo + 1]) << 8)
            ls = (word >> (3 * (s & 3))) & 7
            t = 0
            for h in range(2):
                k = 2 * s + h
                nib = (np.int32(w[r, o + 32 + k // 2]) >> (4 * (k & 1))) & 15
                idx = np.int32(w[r, o + k]) | ((nib & 7) << 8)
                u = 0
                for e in range(8):
                    u += _G1[idx, e] * xq[a, xo + 8 * k + e]
                dl = -1 if nib & 8 else 1
                t += 8 * u + dl * x8[a, b * 32 + k]
            isum += (2 * ls + 1) * t
        acc += np.float32(xd[a, b] * iq1m_d(w, r, o)) * np.float32(isum) * np.float32(0.125)
    return acc


def terms(w: np.ndarray):
    bl = blocks(w, BB)
    n, nb = bl.shape[:2]
    words = bl[..., 48:56].copy().view(np.uint16)  # [n, nb, 4]
    dbits = (
        (words[..., 0] >> 12)
        | ((words[..., 1] >> 8) & 0x00F0)
        | ((words[..., 2] >> 4) & 0x0F00)
        | (words[..., 3] & 0xF000)
    )
    d = dbits.astype(np.uint16).view(np.float16).astype(np.float64)
    ls = ((words[..., None] >> (3 * np.arange(4, dtype=np.uint16))) & 7).reshape(n, nb, 16)
    nib = ((bl[..., 32:48, None] >> np.array([0, 4], np.uint8)) & 15).reshape(n, nb, 32)
    idx = bl[..., 0:32].astype(np.int64) | ((nib & 7).astype(np.int64) << 8)
    g = IQ1S_GRID.astype(np.int64)[idx]  # [n, nb, 32, 8]
    delta = np.where(nib & 8, -1, 1)[..., None]
    v = (8 * g + delta).reshape(n, nb, 16, 16)
    sw = ((2 * ls.astype(np.int64) + 1)[..., None] * v).reshape(n, -1)
    return [(d * 0.125, sw, 256)]
