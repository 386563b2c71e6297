"""F16, BF16 and F32 weights against a float activation already rounded to the weight's type.

ggml rounds the activation to F16/BF16 and sums the products in float32 SIMD lanes; we sum in
float64 (closer to the exact dot, well within the tests' tolerance of ggml's order).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.common import bits_f32, f16_at


@njit(cache=True)
def dot_f16(w, r, xq, xd, xb, x8, xf, a):
    acc = 0.0
    for i in range(w.shape[1] // 2):
        acc += f16_at(w, r, 2 * i) * xf[a, i]
    return np.float32(acc)


@njit(cache=True)
def dot_bf16(w, r, xq, xd, xb, x8, xf, a):
    acc = 0.0
    for i in range(w.shape[1] // 2):
        u = (np.uint32(w[r, 2 * i]) << 16) | (np.uint32(w[r, 2 * i + 1]) << 24)
        acc += bits_f32(u) * xf[a, i]
    return np.float32(acc)


@njit(cache=True)
def dot_f32(w, r, xq, xd, xb, x8, xf, a):
    acc = 0.0
    for i in range(w.shape[1] // 4):
        u = (
            np.uint32(w[r, 4 * i])
            | (np.uint32(w[r, 4 * i + 1]) << 8)
            | (np.uint32(w[r, 4 * i + 2]) << 16)
            | (np.uint32(w[r, 4 * i + 3]) << 24)
        )
        acc += bits_f32(u) * xf[a, i]
    return np.float32(acc)
