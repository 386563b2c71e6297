"""Kernel codes and the one dispatching dot: how the pool reaches every format.

Callers pass the code as a literal (`numba.literally`), so each compiled specialization holds
only the kernels it uses (the other branches are pruned before typing): compile time stays
proportional to the formats a model has, and the result is cached per code (Numba cannot cache
closures or functions taking other dispatchers as arguments).
"""

from __future__ import annotations

import numpy as np
from numba import literally, njit

from strata.cpu.kernels.floats import dot_bf16, dot_f16, dot_f32
from strata.cpu.kernels.iq1 import dot_iq1_m
from strata.cpu.kernels.iq1_t2 import dot_t2_avx2, dot_t2_portable
from strata.cpu.kernels.iq2 import dot_iq2_s, dot_iq2_xxs
from strata.cpu.kernels.iq3 import dot_iq3_s, dot_iq3_xxs
from strata.cpu.kernels.iq3_lut4 import dot_lut4_avx2, dot_lut4_portable
from strata.cpu.kernels.iq4 import dot_iq4_xs
from strata.cpu.kernels.kquants import dot_q4_k, dot_q5_k, dot_q6_k
from strata.cpu.kernels.kquants_avx2 import dot_q4_k_avx2
from strata.cpu.kernels.q8_0 import dot_q8_0
from strata.quant.formats import QT

# portable kernels, on the GGUF bytes as they are
K_F32, K_F16, K_BF16, K_Q8_0 = 0, 1, 2, 3
K_Q4_K, K_Q5_K, K_Q6_K, K_IQ4_XS = 4, 5, 6, 7
K_IQ3_XXS, K_IQ3_S, K_IQ2_XXS, K_IQ2_S, K_IQ1_M = 8, 9, 10, 11, 12

# SIMD kernels and repacked layouts (see layout.py for which one a matrix gets)
K_Q4_K_AVX2 = 20
K_IQ3_XXS_LUT4, K_IQ3_XXS_LUT4_AVX2 = 21, 22
K_IQ1_M_T2, K_IQ1_M_T2_AVX2 = 23, 24

PORTABLE = {
    QT.F32: K_F32, QT.F16: K_F16, QT.BF16: K_BF16, QT.Q8_0: K_Q8_0,
    QT.Q4_K: K_Q4_K, QT.Q5_K: K_Q5_K, QT.Q6_K: K_Q6_K, QT.IQ4_XS: K_IQ4_XS,
    QT.IQ3_XXS: K_IQ3_XXS, QT.IQ3_S: K_IQ3_S, QT.IQ2_XXS: K_IQ2_XXS, QT.IQ2_S: K_IQ2_S,
    QT.IQ1_M: K_IQ1_M,
}


@njit(cache=True)
def dot(code, w, r, xq, xd, xb, x8, xf, a):
    """Row r of w against act row a with kernel `code`; float32."""
    if code == K_IQ3_XXS_LUT4_AVX2:
        return dot_lut4_avx2(w, r, xq, xd, xb, x8, xf, a)
    if code == K_Q4_K_AVX2:
        return dot_q4_k_avx2(w, r, xq, xd, xb, x8, xf, a)
    if code == K_IQ1_M_T2_AVX2:
        return dot_t2_avx2(w, r, xq, xd, xb, x8, xf, a)
    if code == K_IQ3_XXS_LUT4:
        return dot_lut4_portable(w, r, xq, xd, xb, x8, xf, a)
    if code == K_IQ1_M_T2:
        return dot_t2_portable(w, r, xq, xd, xb, x8, xf, a)
    if code == K_IQ3_XXS:
        return dot_iq3_xxs(w, r, xq, xd, xb, x8, xf, a)
    if code == K_Q4_K:
        return dot_q4_k(w, r, xq, xd, xb, x8, xf, a)
    if code == K_IQ1_M:
        return dot_iq1_m(w, r, xq, xd, xb, x8, xf, a)
    if code == K_Q5_K:
        return dot_q5_k(w, r, xq, xd, xb, x8, xf, a)
    if code == K_Q6_K:
        return dot_q6_k(w, r, xq, xd, xb, x8, xf, a)
    if code == K_IQ4_XS:
        return dot_iq4_xs(w, r, xq, xd, xb, x8, xf, a)
    if code == K_IQ3_S:
        return dot_iq3_s(w, r, xq, xd, xb, x8, xf, a)
    if code == K_IQ2_XXS:
        return dot_iq2_xxs(w, r, xq, xd, xb, x8, xf, a)
    if code == K_IQ2_S:
        return dot_iq2_s(w, r, xq, xd, xb, x8, xf, a)
    if code == K_Q8_0:
        return dot_q8_0(w, r, xq, xd, xb, x8, xf, a)
    if code == K_F16:
        return dot_f16(w, r, xq, xd, xb, x8, xf, a)
    if code == K_BF16:
        return dot_bf16(w, r, xq, xd, xb, x8, xf, a)
    if code == K_F32:
        return dot_f32(w, r, xq, xd, xb, x8, xf, a)
    return np.float32(np.nan)


@njit(cache=True)
def gemv(code, w, xq, xd, xb, x8, xf, y):
    """y [n, R] = every row of w against every act row (single thread; tests and tools)."""
    literally(code)  # compile only this code's kernel (dead branches pruned)
    for r in range(w.shape[0]):
        for a in range(y.shape[0]):
            y[a, r] = dot(code, w, r, xq, xd, xb, x8, xf, a)
