"""Kernel codes and the one dispatching dot: how the pool reaches every format.

Callers pass the code as a literal (`numba.literally`), so each compiled specialization holds
only the kernels it uses (the other branches are pruned before typing): compile time stays
proportional to the formats a model has, and the result is cached per code (Numba cannot cache
closures or functions taking other dispatchers as arguments).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import literally, njit, types
from numba.extending import overload

from strata.cpu.kernels.floats import dot_bf16, dot_f16, dot_f32
from strata.cpu.kernels.iq1.portable import dot_iq1_m
from strata.cpu.kernels.iq1.t2_avx2 import dot_t2_avx2
from strata.cpu.kernels.iq1.t2_avx512 import dot_t2_avx512
from strata.cpu.kernels.iq2.portable import dot_iq2_s, dot_iq2_xxs
from strata.cpu.kernels.iq2.s_lut4_avx2 import dot_iq2s_lut4_avx2
from strata.cpu.kernels.iq3.pm_avx512 import dot_pm_avx512
from strata.cpu.kernels.iq3.portable import dot_iq3_s, dot_iq3_xxs
from strata.cpu.kernels.iq4.avx2 import dot_iq4_xs_avx2, dot_q8_0_avx2
from strata.cpu.kernels.iq4.portable import dot_iq4_xs
from strata.cpu.kernels.kquants.avx2 import dot_q4_k_avx2, dot_q5_k_avx2, dot_q6_k_avx2
from strata.cpu.kernels.kquants.avx512 import dot_q4_k_avx512, dot_q5_k_avx512, dot_q6_k_avx512
from strata.cpu.kernels.kquants.portable import dot_q4_k, dot_q5_k, dot_q6_k
from strata.cpu.kernels.lut4 import dot_lut4_2xxs_avx2, dot_lut4_avx2, dot_lut4_s_avx2
from strata.cpu.kernels.mxfp4.avx2 import dot_mxfp4_avx2
from strata.cpu.kernels.mxfp4.portable import dot_mxfp4
from strata.cpu.kernels.q8_0.portable import dot_q8_0
from strata.cpu.kernels.tile import (
    TILE,
    dotn_f32,
    dotn_lut4_2xxs_avx2,
    dotn_lut4_avx2,
    dotn_lut4_s_avx2,
    dotn_q6_k_avx2,
)

# portable kernels, on the GGUF bytes as they are
K_F32, K_F16, K_BF16, K_Q8_0 = 0, 1, 2, 3
K_Q4_K, K_Q5_K, K_Q6_K, K_IQ4_XS = 4, 5, 6, 7
K_IQ3_XXS, K_IQ3_S, K_IQ2_XXS, K_IQ2_S, K_IQ1_M = 8, 9, 10, 11, 12
K_MXFP4 = 13
# AVX2 kernels: on the GGUF bytes, or on a repacked layout (lut4, t2: see layout.py)
K_Q4_K_AVX2, K_Q5_K_AVX2, K_Q6_K_AVX2, K_IQ4_XS_AVX2, K_Q8_0_AVX2 = 20, 25, 26, 27, 28
K_IQ3_XXS_LUT4_AVX2, K_IQ3_S_LUT4_AVX2, K_IQ2_XXS_LUT4_AVX2 = 22, 30, 32
K_IQ2_S_LUT4_AVX2, K_IQ1_M_T2_AVX2 = 52, 24
K_MXFP4_AVX2 = 29
# AVX-512 VBMI + VNNI kernels: IQ1_M's T2, IQ3_XXS position-major (pm), K-quants' GGUF bytes
K_IQ1_M_T2_AVX512, K_IQ3_XXS_PM_AVX512 = 41, 44
K_Q4_K_AVX512, K_Q5_K_AVX512, K_Q6_K_AVX512 = 53, 54, 55

KERNELS = {
    K_F32: dot_f32,
    K_F16: dot_f16,
    K_BF16: dot_bf16,
    K_Q8_0: dot_q8_0,
    K_Q4_K: dot_q4_k,
    K_Q5_K: dot_q5_k,
    K_Q6_K: dot_q6_k,
    K_IQ4_XS: dot_iq4_xs,
    K_IQ3_XXS: dot_iq3_xxs,
    K_IQ3_S: dot_iq3_s,
    K_IQ2_XXS: dot_iq2_xxs,
    K_IQ2_S: dot_iq2_s,
    K_IQ1_M: dot_iq1_m,
    K_MXFP4: dot_mxfp4,
    K_Q4_K_AVX2: dot_q4_k_avx2,
    K_Q5_K_AVX2: dot_q5_k_avx2,
    K_Q6_K_AVX2: dot_q6_k_avx2,
    K_IQ4_XS_AVX2: dot_iq4_xs_avx2,
    K_Q8_0_AVX2: dot_q8_0_avx2,
    K_MXFP4_AVX2: dot_mxfp4_avx2,
    K_IQ3_XXS_LUT4_AVX2: dot_lut4_avx2,
    K_IQ3_S_LUT4_AVX2: dot_lut4_s_avx2,
    K_IQ2_XXS_LUT4_AVX2: dot_lut4_2xxs_avx2,
    K_IQ2_S_LUT4_AVX2: dot_iq2s_lut4_avx2,
    K_IQ1_M_T2_AVX2: dot_t2_avx2,
    K_IQ1_M_T2_AVX512: dot_t2_avx512,
    K_IQ3_XXS_PM_AVX512: dot_pm_avx512,
    K_Q4_K_AVX512: dot_q4_k_avx512,
    K_Q5_K_AVX512: dot_q5_k_avx512,
    K_Q6_K_AVX512: dot_q6_k_avx512,
}


# kernels that take a tile of activation rows a call, each weight block decoded once (tile.py)
KERNELS_N = {
    K_F32: dotn_f32,
    K_IQ3_XXS_LUT4_AVX2: dotn_lut4_avx2,
    K_IQ3_S_LUT4_AVX2: dotn_lut4_s_avx2,
    K_IQ2_XXS_LUT4_AVX2: dotn_lut4_2xxs_avx2,
    K_Q6_K_AVX2: dotn_q6_k_avx2,
}


def dot(code, w, r, xq, xd, xb, x8, xf, a):
    """Row r of w against act row a with kernel `code` (a literal in jitted callers); float32."""
    raise NotImplementedError("dot is only callable from jitted code")


# inline: the kernel call lands in the caller itself (a kernel marked inline="always" with it)
@overload(dot, prefer_literal=True, inline="always")
def _dot(code, w, r, xq, xd, xb, x8, xf, a):
    if not isinstance(code, types.IntegerLiteral):
        # typed once without the literal before `literally` retypes the caller: compile nothing
        def unresolved(code, w, r, xq, xd, xb, x8, xf, a):
            return np.float32(np.nan)

        return unresolved
    kernel = KERNELS[code.literal_value]

    def impl(code, w, r, xq, xd, xb, x8, xf, a):
        return kernel(w, r, xq, xd, xb, x8, xf, a)

    return impl


def dotn(code, w, r, xq, xd, xb, x8, xf, rows, n, y):
    """y[i] = row r of w against act row rows[i] (int64), i < n <= TILE: `dot`'s bits each."""
    raise NotImplementedError("dotn is only callable from jitted code")


@overload(dotn, prefer_literal=True)
def _dotn(code, w, r, xq, xd, xb, x8, xf, rows, n, y):
    if not isinstance(code, types.IntegerLiteral):

        def unresolved(code, w, r, xq, xd, xb, x8, xf, rows, n, y):
            y[:n] = np.nan

        return unresolved
    tiled = KERNELS_N.get(code.literal_value)
    kernel = KERNELS[code.literal_value]
    if tiled is not None:

        def impl_tile(code, w, r, xq, xd, xb, x8, xf, rows, n, y):
            if n == 1:  # a decode's one row: the one-row kernel, no tile set-up
                y[0] = kernel(w, r, xq, xd, xb, x8, xf, rows[0])
            else:
                tiled(w, r, xq, xd, xb, x8, xf, rows, n, y)

        return impl_tile

    def impl(code, w, r, xq, xd, xb, x8, xf, rows, n, y):  # one row at a time
        for i in range(n):
            y[i] = kernel(w, r, xq, xd, xb, x8, xf, rows[i])

    return impl


@njit(cache=True)
def gemv(code, w, xq, xd, xb, x8, xf, y):
    """y [n, R] = every row of w against every act row, TILE act rows a call (`dotn`; single
    thread; tests and tools)."""
    literally(code)  # compile only this code's kernel (dead branches pruned)
    rows = np.arange(y.shape[0])
    yt = np.zeros(TILE, np.float32)
    for r in range(w.shape[0]):
        for a0 in range(0, y.shape[0], TILE):
            n = min(TILE, y.shape[0] - a0)
            dotn(code, w, r, xq, xd, xb, x8, xf, rows[a0:], n, yt)
            for i in range(n):
                y[a0 + i, r] = yt[i]


def specialized(fn, args: tuple, literal_pos: tuple[int, ...]):
    """The compiled entry point of jitted `fn` for `args`, with the arguments at `literal_pos`
    typed as literals. Calling it skips Numba's dispatch, which for a function that asks for
    literals (`literally`) would re-type a non-literal version on every call (milliseconds)."""
    return _compiled(fn, args, literal_pos).entry_point


def native_address(fn, args: tuple, literal_pos: tuple[int, ...]) -> int:
    """The address of the C-ABI wrapper Numba builds beside the compiled `fn` for `args` (as
    `specialized`): callable from other compiled code through a pointer (the pool's team
    members, strata.cpu.team.call_job). Integer arguments only: literals are passed as int64
    (and ignored by the wrapper)."""
    cres = _compiled(fn, args, literal_pos)
    return cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)


def _compiled(fn, args: tuple, literal_pos: tuple[int, ...]):
    sig = [numba.typeof(a) for a in args]
    for i in literal_pos:
        sig[i] = types.literal(args[i])
    sig = tuple(sig)
    if sig not in fn.overloads:
        fn.compile(sig)
    return fn.overloads[sig]
