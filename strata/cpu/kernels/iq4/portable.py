"""IQ4_XS weights (super-blocks of 256, 136 bytes) against a Q8_K activation: portable kernel.

w = d * (ls[s] - 32) * kvalues[q] over 8 sub-blocks of 32; ls is 6 bits (4 in scales_l, 2 in
scales_h); q are nibbles (sub-block s: bytes 16s..16s+15, low nibbles first, then high).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.reference import blocks, f16
from strata.cpu.kernels.tables import KVALUES_IQ4NL

BB = 136
_KV = KVALUES_IQ4NL


@njit(cache=True)
def dot_iq4_xs(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // BB):
        o = b * BB
        xo = b * 256
        sh = np.int32(w[r, o + 2]) | (np.int32(w[r, o + 3]) << 8)
        isum = 0
        for s in range(8):
            ls = ((w[r, o + 4 + s // 2] >> (4 * (s & 1))) & 15) | (((sh >> (2 * s)) & 3) << 4)
            t = 0
            for i in range(16):
                q = w[r, o + 8 + 16 * s + i]
                t += _KV[q & 15] * xq[a, xo + 32 * s + i]
                t += _KV[q >> 4] * xq[a, xo + 32 * s + 16 + i]
            isum += (np.int32(ls) - 32) * t
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum)
    return acc


def terms(w: np.ndarray):
    bl = blocks(w, BB)
    n, nb = bl.shape[:2]
    sh = bl[..., 2:4].copy().view(np.uint16)  # [n, nb, 1]
    sl = bl[..., 4:8]
    lo = ((sl[..., :, None] >> np.array([0, 4], np.uint8)) & 15).reshape(n, nb, 8)
    hi = (sh >> (2 * np.arange(8, dtype=np.uint16))) & 3
    ls = (lo.astype(np.int64) | (hi.astype(np.int64) << 4)) - 32
    qs = bl[..., 8:].reshape(n, nb, 8, 1, 16)
    q = ((qs >> np.array([0, 4], np.uint8)[:, None]) & 15).reshape(n, nb, 8, 32)
    v = KVALUES_IQ4NL.astype(np.int64)[q]
    sw = (ls[..., None] * v).reshape(n, -1)
    return [(f16(bl[..., 0:2]), sw, 256)]
