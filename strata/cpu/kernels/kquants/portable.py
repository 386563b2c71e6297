"""Q4_K, Q5_K, Q6_K weights (super-blocks of 256) against a Q8_K activation: portable kernels.

Q4_K/Q5_K: w = d * sc[s] * q - dmin * m[s] over 8 sub-blocks of 32 (6-bit sc, m packed in 12
bytes); Q6_K: w = d * sc[s] * (q - 32) over 16 sub-blocks of 16 (int8 sc). The min/offset terms
use the activation's block sums (xb) as ggml does.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.reference import blocks, f16

Q4K_BB, Q5K_BB, Q6K_BB = 144, 176, 210


@njit(cache=True, inline="always")
def scale_min_k4(w, r, o, j):
    """Sub-block j's 6-bit (scale, min) from the 12 scale bytes at w[r, o:o+12] (ggml's k4)."""
    if j < 4:
        return np.int32(w[r, o + j] & 63), np.int32(w[r, o + j + 4] & 63)
    sc = (w[r, o + j + 4] & 0xF) | ((w[r, o + j - 4] >> 6) << 4)
    m = (w[r, o + j + 4] >> 4) | ((w[r, o + j] >> 6) << 4)
    return np.int32(sc), np.int32(m)


@njit(cache=True, inline="always")
def kmin_block(w, r, o, dx, isum, msum):
    """A Q4_K / Q5_K super-block's float steps (every kernel's, in this order): d dx isum -
    dmin dx msum, with d and dmin the f16 pair at w[r, o:o+4] and dx the activation's scale."""
    return np.float32(dx * f16_at(w, r, o)) * np.float32(isum) - np.float32(
        dx * f16_at(w, r, o + 2)
    ) * np.float32(msum)


@njit(cache=True)
def dot_q4_k(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q4K_BB):
        o = b * Q4K_BB
        xo = b * 256
        isum = 0
        msum = 0
        for j in range(4):
            sc0, m0 = scale_min_k4(w, r, o + 4, 2 * j)
            sc1, m1 = scale_min_k4(w, r, o + 4, 2 * j + 1)
            s0 = 0
            s1 = 0
            qo = o + 16 + 32 * j
            for i in range(32):
                q = w[r, qo + i]
                s0 += (q & 15) * xq[a, xo + 64 * j + i]
                s1 += (q >> 4) * xq[a, xo + 64 * j + 32 + i]
            bo = b * 16 + 4 * j
            isum += sc0 * s0 + sc1 * s1
            msum += m0 * (xb[a, bo] + xb[a, bo + 1]) + m1 * (xb[a, bo + 2] + xb[a, bo + 3])
        acc += kmin_block(w, r, o, xd[a, b], isum, msum)
    return acc


@njit(cache=True)
def dot_q5_k(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q5K_BB):
        o = b * Q5K_BB
        xo = b * 256
        qh = o + 16
        ql = o + 48
        isum = 0
        msum = 0
        for s in range(8):
            sc, m = scale_min_k4(w, r, o + 4, s)
            sh = 4 * (s & 1)
            qo = ql + 32 * (s >> 1)
            t = 0
            for i in range(32):
                q = ((w[r, qo + i] >> sh) & 15) | (((w[r, qh + i] >> s) & 1) << 4)
                t += q * xq[a, xo + 32 * s + i]
            isum += sc * t
            msum += m * (xb[a, b * 16 + 2 * s] + xb[a, b * 16 + 2 * s + 1])
        acc += kmin_block(w, r, o, xd[a, b], isum, msum)
    return acc


@njit(cache=True)
def dot_q6_k(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q6K_BB):
        o = b * Q6K_BB
        xo = b * 256
        isum = 0
        for h in range(2):  # halves of 128 weights: ql[64h:64h+64], qh[32h:32h+32]
            for k in range(4):  # 32-weight quarters
                for half16 in range(2):
                    s = 8 * h + 2 * k + half16
                    t = 0
                    for i in range(16 * half16, 16 * half16 + 16):
                        lo = (w[r, o + 64 * h + 32 * (k & 1) + i] >> (4 * (k >> 1))) & 15
                        hi = (w[r, o + 128 + 32 * h + i] >> (2 * k)) & 3
                        t += (lo | (hi << 4)) * xq[a, xo + 128 * h + 32 * k + i]
                    sc = np.int32(np.int8(w[r, o + 192 + s]))
                    isum += sc * (t - 32 * xb[a, b * 16 + s])
        acc += np.float32(xd[a, b] * f16_at(w, r, o + 208)) * np.float32(isum)
    return acc


# ---- NumPy references: dequant = sum of F * SW terms (see reference.py)


def _scale_min(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d, m, md = sc12[..., 0:4], sc12[..., 4:8], sc12[..., 8:12]
    sc = np.concatenate([d & 63, (md & 15) | ((d >> 6) << 4)], axis=-1).astype(np.int64)
    mn = np.concatenate([m & 63, (md >> 4) | ((m >> 6) << 4)], axis=-1).astype(np.int64)
    return sc, mn  # [R, nb, 8]


def _k_terms(w, bb, q):
    bl = blocks(w, bb)
    sc, mn = _scale_min(bl[..., 4:16])
    r = w.shape[0]
    sw = (np.repeat(sc, 32, axis=-1) * q).reshape(r, -1)
    mw = np.repeat(mn, 32, axis=-1).reshape(r, -1)
    return [(f16(bl[..., 0:2]), sw, 256), (-f16(bl[..., 2:4]), mw, 256)]


def q4_k_terms(w: np.ndarray):
    bl = blocks(w, Q4K_BB)
    qs = bl[..., 16:].reshape(*bl.shape[:2], 4, 1, 32)
    q = ((qs >> np.array([0, 4], np.uint8)[:, None]) & 15).reshape(*bl.shape[:2], 256)
    return _k_terms(w, Q4K_BB, q.astype(np.int64))


def q5_k_terms(w: np.ndarray):
    bl = blocks(w, Q5K_BB)
    qh = bl[..., 16:48].reshape(*bl.shape[:2], 1, 32)
    qs = bl[..., 48:].reshape(*bl.shape[:2], 4, 1, 32)
    lo = ((qs >> np.array([0, 4], np.uint8)[:, None]) & 15).reshape(*bl.shape[:2], 8, 32)
    hi = (qh >> np.arange(8, dtype=np.uint8)[:, None]) & 1
    q = (lo | (hi << 4)).reshape(*bl.shape[:2], 256)
    return _k_terms(w, Q5K_BB, q.astype(np.int64))


def q6_k_terms(w: np.ndarray):
    bl = blocks(w, Q6K_BB)
    n, nb = bl.shape[:2]
    ql = bl[..., 0:128].reshape(n, nb, 2, 1, 64)
    ql = ((ql >> np.array([0, 4], np.uint8)[:, None]) & 15).reshape(n, nb, 2, 4, 32)
    qh = bl[..., 128:192].reshape(n, nb, 2, 1, 32)
    qh = (qh >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
    q = (ql | (qh << 4)).reshape(n, nb, 256).astype(np.int64) - 32
    sc = bl[..., 192:208].view(np.int8).astype(np.int64)
    sw = (np.repeat(sc, 16, axis=-1) * q).reshape(n, -1)
    return [(f16(bl[..., 208:210]), sw, 256)]
