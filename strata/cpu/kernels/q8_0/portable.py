"""Q8_0 weights (blocks of 32: f16 d, 32 int8) against a Q8_0 activation."""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.reference import blocks, f16

BB = 34  # block bytes


@njit(cache=True)
def dot_q8_0(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // BB):
        o = b * BB
        s = 0
        for i in range(32):
            s += np.int8(w[r, o + 2 + i]) * xq[a, 32 * b + i]
        acc += np.float32(f16_at(w, r, o) * xd[a, b]) * np.float32(s)
    return acc


def terms(w: np.ndarray):
    bl = blocks(w, BB)
    q = bl[..., 2:].view(np.int8).reshape(w.shape[0], -1).astype(np.int64)
    return [(f16(bl[..., 0:2]), q, 32)]
