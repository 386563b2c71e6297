"""IQ3_XXS and IQ3_S weights against a Q8_K activation: portable kernels and references.

IQ3_XXS (98 bytes): f16 d, 64 grid indices (4 magnitudes each), 8 u32 words (4 x 7 sign bits,
the 8th sign is their parity via ksigns, and a 4-bit scale): w = d * (2 ls + 1) / 4 * g * s.
IQ3_S (110 bytes): f16 d, 64 index bytes + 8 high-bit bytes (9-bit indices), 32 sign bytes,
4 scale bytes: w = d * (2 ls + 1) * g * s.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.reference import blocks, f16
from strata.cpu.kernels.tables import IQ3S_GRID, IQ3XXS_GRID, KSIGNS

XXS_BB, S_BB = 98, 110
_G3 = IQ3XXS_GRID
_G3S = IQ3S_GRID
_KS = KSIGNS


@njit(cache=True, inline="always")
def u32_at(w, r, o):
    return (
        np.uint32(w[r, o])
        | (np.uint32(w[r, o + 1]) << 8)
        | (np.uint32(w[r, o + 2]) << 16)
        | (np.uint32(w[r, o + 3]) << 24)
    )


@njit(cache=True)
def dot_iq3_xxs(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // XXS_BB):
        o = b * XXS_BB
        xo = b * 256
        isum = 0
        for s in range(8):
            aux = u32_at(w, r, o + 66 + 4 * s)
            t = 0
            for g in range(4):
                signs = _KS[(aux >> (7 * g)) & 127]
                for h in range(2):
                    idx = w[r, o + 2 + 8 * s + 2 * g + h]
                    for k in range(4):
                        v = np.int32(_G3[idx, k])
                        if (signs >> (4 * h + k)) & 1:
                            v = -v
                        t += v * xq[a, xo + 32 * s + 8 * g + 4 * h + k]
            isum += (2 * np.int32(aux >> 28) + 1) * t
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.25)
    return acc


@njit(cache=True)
def dot_iq3_s(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // S_BB):
        o = b * S_BB
        xo = b * 256
        isum = 0
        for s in range(8):
            t = 0
            for j in range(8):  # index j of the sub-block: 4 weights
                k = 8 * s + j
                idx = np.int32(w[r, o + 2 + k]) | (((np.int32(w[r, o + 66 + s]) >> j) & 1) << 8)
                sb = w[r, o + 74 + k // 2] >> (4 * (k & 1))
                for e in range(4):
                    v = np.int32(_G3S[idx, e])
                    if (sb >> e) & 1:
                        v = -v
                    t += v * xq[a, xo + 4 * k + e]
            ls = (w[r, o + 106 + s // 2] >> (4 * (s & 1))) & 15
            isum += (2 * np.int32(ls) + 1) * t
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum)
    return acc


def _signs(sign_bytes: np.ndarray) -> np.ndarray:
    """[..., m] sign bytes -> [..., 8 m] of +1/-1 (bit i of byte j is weight 8 j + i)."""
    bits = (sign_bytes[..., None] >> np.arange(8, dtype=np.uint8)) & 1
    return np.where(bits == 0, 1, -1).reshape(*sign_bytes.shape[:-1], -1).astype(np.int64)


def iq3_xxs_terms(w: np.ndarray):
    bl = blocks(w, XXS_BB)
    n, nb = bl.shape[:2]
    g = IQ3XXS_GRID.astype(np.int64)[bl[..., 2:66]].reshape(n, nb, 8, 32)
    aux = bl[..., 66:98].copy().view(np.uint32)  # [n, nb, 8]
    sidx = (aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127  # [n, nb, 8, 4]
    sg = _signs(KSIGNS[sidx]).reshape(n, nb, 8, 32)
    ls = 2 * (aux >> 28).astype(np.int64) + 1
    sw = (ls[..., None] * g * sg).reshape(n, -1)
    return [(f16(bl[..., 0:2]) * 0.25, sw, 256)]


def iq3_s_terms(w: np.ndarray):
    bl = blocks(w, S_BB)
    n, nb = bl.shape[:2]
    qh = bl[..., 66:74]
    hi = ((qh[..., None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(n, nb, 64)
    idx = bl[..., 2:66].astype(np.int64) | (hi.astype(np.int64) << 8)
    g = IQ3S_GRID.astype(np.int64)[idx].reshape(n, nb, 8, 32)
    sg = _signs(bl[..., 74:106]).reshape(n, nb, 8, 32)
    sc = bl[..., 106:110]
    ls = ((sc[..., None] >> np.array([0, 4], np.uint8)) & 15).reshape(n, nb, 8).astype(np.int64)
    sw = ((2 * ls + 1)[..., None] * g * sg).reshape(n, -1)
    return [(f16(bl[..., 0:2]), sw, 256)]
