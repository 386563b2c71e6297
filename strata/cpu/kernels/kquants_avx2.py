"""Q4_K on the GGUF bytes with AVX2 (no repack: its nibbles already run 32 weights per load).

Per super-block: the 12 scale bytes unpack to 8 scales + 8 mins with four 32-bit mask/shift
steps (as ggml's utmp trick); each 32-byte load of quants feeds two vpmaddubsw (low and high
nibbles against 32 activation bytes each) and vpmaddwd by the broadcast sub-block scale; the mins
meet the Q8_K bsums in one vpmaddwd. The plain twin is `kquants.dot_q4_k`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.kquants import Q4K_BB
from strata.cpu.kernels.simd import HAS_AVX2, I32, V8I32, V16I16, V32I8, Emit

_V4I32 = ir.VectorType(I32, 4)
_V16I8 = ir.VectorType(ir.IntType(8), 16)


@intrinsic
def _blk_q4_k(typingctx, w, r, o, xq, a, xo, xb, bo):
    """(sum_s sc_s sum q x, sum_s m_s bsum_s) of the Q4_K block at w[r, o:o+144] (int32s)."""
    ret = types.UniTuple(types.int32, 2)
    sig = ret(w, types.intp, types.intp, xq, types.intp, types.intp, xb, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            zero = ir.Constant(I32, 0)
            return context.make_tuple(builder, ret, [zero, zero])
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        px = e.ptr(sg.args[3], args[3], args[4], args[5])
        pb = e.ptr(sg.args[6], args[6], args[4], args[7])
        u0, u1, u2 = (e.load(pw, I32, 4 + 4 * k) for k in range(3))
        k1, k2, k3 = (ir.Constant(I32, v) for v in (0x3F3F3F3F, 0x0F0F0F0F, 0x03030303))
        c4, c6 = ir.Constant(I32, 4), ir.Constant(I32, 6)
        sc_lo = b.and_(u0, k1)  # scales 0..3
        sc_hi = b.or_(b.and_(u2, k2), b.shl(b.and_(b.lshr(u0, c6), k3), c4))  # scales 4..7
        mn_lo = b.and_(u1, k1)  # mins 0..3
        mn_hi = b.or_(b.and_(b.lshr(u2, c4), k2), b.shl(b.and_(b.lshr(u1, c6), k3), c4))
        v = ir.Constant(_V4I32, None)
        for i, t in enumerate((sc_lo, sc_hi, mn_lo, mn_hi)):
            v = b.insert_element(v, t, ir.Constant(I32, i))
        sm = b.zext(b.bitcast(v, _V16I8), V16I16)  # lanes 0..7 scales, 8..15 mins
        sc = e.shuffle(sm, list(range(8)) * 2)  # scales in both 128-bit lanes: vpshufb splats
        acc = e.splat(V8I32, 0)
        for j in range(4):
            lo, hi = e.nibbles(e.load(pw, V32I8, 16 + 32 * j))
            pl = e.maddubs(lo, e.load(px, V32I8, 64 * j))
            ph = e.maddubs(hi, e.load(px, V32I8, 64 * j + 32))
            acc = b.add(acc, e.madd(pl, e.shuffle(sc, [2 * j] * 8 + [8 + 2 * j] * 8)))
            acc = b.add(acc, e.madd(ph, e.shuffle(sc, [2 * j + 1] * 8 + [9 + 2 * j] * 8)))
        mins = e.madd(e.load(pb, V16I16), e.shuffle(sm, [8 + k // 2 for k in range(16)]))
        return context.make_tuple(builder, ret, [e.hsum(acc), e.hsum(mins)])

    return sig, codegen


@njit(cache=True)
def dot_q4_k_avx2(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q4K_BB):
        o = b * Q4K_BB
        isum, msum = _blk_q4_k(w, r, o, xq, a, 256 * b, xb, 16 * b)
        dx = xd[a, b]
        acc += np.float32(dx * f16_at(w, r, o)) * np.float32(isum) - np.float32(
            dx * f16_at(w, r, o + 2)
        ) * np.float32(msum)
    return acc
