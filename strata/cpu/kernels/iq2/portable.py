"""IQ2_XXS and IQ2_S weights against a Q8_K activation: portable kernels and references.

IQ2_XXS (66 bytes): f16 d, per sub-block of 32 two u32 words: 4 grid indices (8 magnitudes
each) and 4 x 7 sign bits + a 4-bit scale: w = d * (2 ls + 1) / 8 * g * s.
IQ2_S (82 bytes): f16 d, 32 index bytes, 32 sign bytes, 8 high-bit bytes (10-bit indices),
8 scale bytes (one nibble per 16 weights): w = d * (2 ls + 1) / 8 * g * s.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.iq3.portable import _signs, u32_at
from strata.cpu.kernels.reference import blocks, f16
from strata.cpu.kernels.tables import IQ2S_GRID, IQ2XXS_GRID, KSIGNS

XXS_BB, S_BB = 66, 82
_G2 = IQ2XXS_GRID
_G2S = IQ2S_GRID
_KS = KSIGNS


@njit(cache=True)
def dot_iq2_xxs(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // XXS_BB):
        o = b * XXS_BB
        xo = b * 256
        isum = 0
        for s in range(8):
            aux = u32_at(w, r, o + 2 + 8 * s + 4)
            t = 0
            for g in range(4):
                idx = w[r, o + 2 + 8 * s + g]
                signs = _KS[(aux >> (7 * g)) & 127]
                for k in range(8):
                    v = np.int32(_G2[idx, k])
                    if (signs >> k) & 1:
                        v = -v
                    t += v * xq[a, xo + 32 * s + 8 * g + k]
            isum += (2 * np.int32(aux >> 28) + 1) * t
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.125)
    return acc


@njit(cache=True)
def dot_iq2_s(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // S_BB):
        o = b * S_BB
        xo = b * 256
        isum = 0
        for h in range(16):  # halves of sub-blocks: 16 weights, two grid entries, one scale
            t = 0
            for j in range(2):
                k = 2 * h + j
                hb = (np.int32(w[r, o + 66 + k // 4]) >> (2 * (k & 3))) & 3
                idx = np.int32(w[r, o + 2 + k]) | (hb << 8)
                sb = w[r, o + 34 + k]
                for e in range(8):
                    v = np.int32(_G2S[idx, e])
                    if (sb >> e) & 1:
                        v = -v
                    t += v * xq[a, xo + 8 * k + e]
            ls = (w[r, o + 74 + h // 2] >> (4 * (h & 1))) & 15
            isum += (2 * np.int32(ls) + 1) * t
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.125)
    return acc


def iq2_xxs_terms(w: np.ndarray):
    bl = blocks(w, XXS_BB)
    n, nb = bl.shape[:2]
    words = bl[..., 2:].copy().view(np.uint32).reshape(n, nb, 8, 2)
    idx = words[..., 0:1].copy().view(np.uint8)  # [n, nb, 8, 4]
    g = IQ2XXS_GRID.astype(np.int64)[idx].reshape(n, nb, 8, 32)
    aux = words[..., 1]
    sidx = (aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127
    sg = _signs(KSIGNS[sidx]).reshape(n, nb, 8, 32)
    ls = 2 * (aux >> 28).astype(np.int64) + 1
    sw = (ls[..., None] * g * sg).reshape(n, -1)
    return [(f16(bl[..., 0:2]) * 0.125, sw, 256)]


def iq2_s_terms(w: np.ndarray):
    bl = blocks(w, S_BB)
    n, nb = bl.shape[:2]
    qh = bl[..., 66:74]
    hi = ((qh[..., None] >> np.array([0, 2, 4, 6], np.uint8)) & 3).reshape(n, nb, 32)
    idx = bl[..., 2:34].astype(np.int64) | (hi.astype(np.int64) << 8)
    g = IQ2S_GRID.astype(np.int64)[idx].reshape(n, nb, 16, 16)
    sg = _signs(bl[..., 34:66]).reshape(n, nb, 16, 16)
    sc = bl[..., 74:82]
    ls = ((sc[..., None] >> np.array([0, 4], np.uint8)) & 15).reshape(n, nb, 16).astype(np.int64)
    sw = ((2 * ls + 1)[..., None] * g * sg).reshape(n, -1)
    return [(f16(bl[..., 0:2]) * 0.125, sw, 256)]
