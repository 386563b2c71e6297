"""IQ3_XXS on the GGUF bytes with AVX2 gathers: no repack, more arithmetic per byte.

Per sub-block of 32 weights: one vpgatherdd fetches the 8 grid entries (4 magnitudes each) from
the 1 KB iq3xxs grid, one vpgatherdq the 4 sign patterns (8 bytes of +-1 each, expanded from
ksigns) that vpsignb applies to the activation; vpmaddubsw (magnitudes <= 62: exact) and
vpmaddwd by the sub-block scale finish it. It reads 98 bytes per 256 weights where LUT4 reads
134, but costs two gathers per 32 weights: on the 2-core Zen 3 dev box LUT4 is faster; on a
many-core machine with ~5 GB/s per core the byte saving may win (`layout="gguf"` picks this).
The plain twin is `iq3.dot_iq3_xxs`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.iq3 import XXS_BB
from strata.cpu.kernels.simd import HAS_AVX2, I8, I16, I32, I64, V8I32, V32I8, Emit, signb
from strata.cpu.kernels.tables import IQ3XXS_GRID, KSIGNS

_GRID_U32 = [int(v) for v in IQ3XXS_GRID.copy().view("<u4")[:, 0]]
# ksigns index -> 8 bytes of +1 / -1 (0x01 / 0xFF), little-endian u64
_SIGNS_U64 = [
    int(np.where((int(k) >> np.arange(8)) & 1, 0xFF, 0x01).astype(np.uint8).view("<u8")[0])
    for k in KSIGNS
]
_V4I32 = ir.VectorType(I32, 4)
_V4I64 = ir.VectorType(I64, 4)
_V8I16 = ir.VectorType(I16, 8)


def _table(e: Emit, name: str, ty, values):
    """i8* to an internal constant table in the module being built (made once per module)."""
    mod = e.mod
    try:
        gv = mod.get_global(name)
    except KeyError:
        arr = ir.ArrayType(ty, len(values))
        gv = ir.GlobalVariable(mod, arr, name)
        gv.linkage = "internal"
        gv.global_constant = True
        gv.initializer = ir.Constant(arr, values)
        gv.align = 64
    return e.b.bitcast(gv, I8.as_pointer())


@intrinsic
def _blk_iq3_xxs(typingctx, w, r, o, xq, a, xo):
    """sum_s (2 ls_s + 1) sum_{i in s} g_i s_i x_i over the IQ3_XXS block at w[r, o:o+98]."""
    sig = types.int32(w, types.intp, types.intp, xq, types.intp, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(I32, 0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        px = e.ptr(sg.args[3], args[3], args[4], args[5])
        grid = _table(e, "strata_iq3xxs_grid_u32", I32, _GRID_U32)
        signs = _table(e, "strata_ksigns_pm1_u64", I64, _SIGNS_U64)
        aux = e.load(pw, V8I32, 66)  # 8 words: 4 x 7 sign bits + a 4-bit scale each
        ls = b.lshr(aux, e.splat(V8I32, 28))
        sc = b.trunc(b.or_(b.shl(ls, e.splat(V8I32, 1)), e.splat(V8I32, 1)), _V8I16)
        sc = e.shuffle(sc, list(range(8)) * 2)  # both 128-bit lanes: splats become vpshufb
        gather_dd = ir.FunctionType(V8I32, [V8I32, I8.as_pointer(), V8I32, V8I32, I8])
        gather_dq = ir.FunctionType(_V4I64, [_V4I64, I8.as_pointer(), _V4I32, _V4I64, I8])
        gdd = cgutils.get_or_insert_function(e.mod, gather_dd, "llvm.x86.avx2.gather.d.d.256")
        gdq = cgutils.get_or_insert_function(e.mod, gather_dq, "llvm.x86.avx2.gather.d.q.256")
        all8 = e.splat(V8I32, -1)
        all4 = ir.Constant(_V4I64, [-1] * 4)
        shifts = ir.Constant(_V4I32, [0, 7, 14, 21])
        m127 = ir.Constant(_V4I32, [127] * 4)
        acc = e.splat(V8I32, 0)
        for s in range(8):
            idx = b.zext(e.load(pw, ir.VectorType(I8, 8), 2 + 8 * s), V8I32)
            mag = b.call(gdd, [e.splat(V8I32, 0), grid, idx, all8, ir.Constant(I8, 4)])
            a_s = b.extract_element(aux, ir.Constant(I32, s))
            sidx = b.and_(b.lshr(e.bcast(a_s, _V4I32), shifts), m127)
            sgn = b.call(gdq, [ir.Constant(_V4I64, [0] * 4), signs, sidx, all4, ir.Constant(I8, 8)])
            x = signb(e, e.load(px, V32I8, 32 * s), b.bitcast(sgn, V32I8))
            p = e.maddubs(b.bitcast(mag, V32I8), x)
            acc = b.add(acc, e.madd(p, e.shuffle(sc, [s] * 8 + [8 + s] * 8)))
        return e.hsum(acc)

    return sig, codegen


@njit(cache=True)
def dot_iq3_xxs_avx2(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // XXS_BB):
        o = b * XXS_BB
        isum = _blk_iq3_xxs(w, r, o, xq, a, 256 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.25)
    return acc
