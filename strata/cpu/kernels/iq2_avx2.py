"""IQ2_S on the GGUF bytes with AVX2: grid rows by scalar loads, no repack.

Per 32 weights (4 groups of 8): the 4 grid rows (8 magnitudes in {8, 25, 43} each) are loaded
from an 8 KB table (1024 rows of u64) and inserted into one 256-bit vector; the 8 sign bits per
group, stored as they are, are expanded with a byte shuffle and a bit mask and applied to the
activation; vpmaddubsw (magnitudes <= 43: exact) and vpmaddwd by the scales finish it. (IQ2_XXS
on the GGUF bytes: gather.py.) Plain twin: `iq2.dot_iq2_s`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.iq2 import S_BB
from strata.cpu.kernels.simd import HAS_AVX2, I8, I32, I64, V8I32, V16I16, V32I8, Emit, const_table
from strata.cpu.kernels.tables import IQ2S_GRID

_IQ2S_U64 = [int(v) for v in IQ2S_GRID.copy().view("<u8")[:, 0]]
_V4I64 = ir.VectorType(I64, 4)
_V8I8 = ir.VectorType(I8, 8)


def _rows4(e: Emit, table, idx):
    """<32 x i8>: the four u64 table rows idx[0..3] (i64 IR values) side by side."""
    b = e.b
    tab = b.bitcast(table, I64.as_pointer())
    v = ir.Constant(_V4I64, None)
    for i, ix in enumerate(idx):
        row = b.load(b.gep(tab, [ix]), align=8)
        v = b.insert_element(v, row, ir.Constant(I32, i))
    return b.bitcast(v, V32I8)


@intrinsic
def _blk_iq2_s(typingctx, w, r, o, xq, a, xo):
    """sum_h (2 ls_h + 1) sum_{i in h} g_i s_i x_i over the IQ2_S block at w[r, o:o+82]."""
    sig = types.int32(w, types.intp, types.intp, xq, types.intp, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(I32, 0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        px = e.ptr(sg.args[3], args[3], args[4], args[5])
        grid = const_table(e, "strata_iq2s_grid_u64", I64, _IQ2S_U64)
        # 16 scales 2 ls + 1 (one nibble per 16 weights, low nibble first)
        sb = b.zext(e.shuffle(e.load(pw, _V8I8, 74), [h // 2 for h in range(16)]), V16I16)
        ls = b.and_(
            b.lshr(sb, e.const(V16I16, [4 * (h & 1) for h in range(16)])), e.splat(V16I16, 15)
        )
        sc = b.or_(b.shl(ls, e.splat(V16I16, 1)), e.splat(V16I16, 1))
        bits = e.const(V32I8, [(1 << (i % 8)) - (256 if i % 8 == 7 else 0) for i in range(32)])
        acc = e.splat(V8I32, 0)
        for j in range(8):  # 32 weights: groups 4j..4j+3, one qh byte
            qh = b.zext(e.load(pw, I8, 66 + j), I64)
            idx = []
            for i in range(4):
                lo = b.zext(e.load(pw, I8, 2 + 4 * j + i), I64)
                hi = b.and_(b.lshr(qh, ir.Constant(I64, 2 * i)), ir.Constant(I64, 3))
                idx.append(b.or_(lo, b.shl(hi, ir.Constant(I64, 8))))
            g = _rows4(e, grid, idx)
            # sign bytes of the 4 groups -> byte i is -1 where bit i % 8 of byte i // 8 is set
            s4 = b.bitcast(e.bcast(e.load(pw, I32, 34 + 4 * j), V8I32), V32I8)
            s32 = e.shuffle(s4, [i // 8 for i in range(16)] + [16 + 2 + i // 8 for i in range(16)])
            neg = b.sext(b.icmp_unsigned("!=", b.and_(s32, bits), e.splat(V32I8, 0)), V32I8)
            x = e.load(px, V32I8, 32 * j)
            sx = b.sub(b.xor(x, neg), neg)  # -x where the sign bit is set (|x| <= 127)
            p = e.maddubs(g, sx)
            acc = b.add(acc, e.madd(p, e.shuffle(sc, [2 * j] * 8 + [2 * j + 1] * 8)))
        return e.hsum(acc)

    return sig, codegen


@njit(cache=True)
def dot_iq2_s_avx2(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // S_BB):
        o = b * S_BB
        isum = _blk_iq2_s(w, r, o, xq, a, 256 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.125)
    return acc
