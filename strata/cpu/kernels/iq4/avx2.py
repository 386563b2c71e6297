"""IQ4_XS and Q8_0 on the GGUF bytes with AVX2: signed 8-bit weights, the vpsignb trick.

Both formats give signed int8 weights (IQ4_XS through the 16-entry kvalues table, one vpshufb per
32 weights; Q8_0 directly). vpmaddubsw wants an unsigned operand, so it gets |w| and the
activation takes w's sign (vpsignb), as ggml does; |w| <= 127 keeps the int16 pairs exact.

IQ4_XS: the 32 bytes of two sub-blocks hold, in their low nibbles, the first 16 weights of each
and in their high nibbles the last 16, so each nibble vector meets two 16-byte activation halves
joined by vinserti128. Plain twins: `iq4.dot_iq4_xs`, `q8_0.dot_q8_0`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.iq4.portable import BB as IQ4_BB
from strata.cpu.kernels.q8_0.portable import BB as Q8_BB
from strata.cpu.kernels.simd import (
    I16,
    I32,
    V8I32,
    V16I8,
    V16I16,
    V32I8,
    Emit,
    absb,
    concat16,
    signb,
)
from strata.cpu.kernels.tables import KVALUES_IQ4NL

_KV = [int(v) & 0xFF for v in KVALUES_IQ4NL] * 2
_V8I16 = ir.VectorType(I16, 8)


def _sdot(e, w, x):
    """int16 pair sums of the signed bytes w and x (vpmaddubsw with the sign trick)."""
    return e.maddubs(absb(e, w), signb(e, x, w))


@intrinsic
def _blk_iq4_xs(typingctx, w, r, o, xq, a, xo):
    """sum_s (ls_s - 32) sum_{i in s} kv[q_i] x_i over the IQ4_XS block at w[r, o:o+136]."""
    sig = types.int32(w, types.intp, types.intp, xq, types.intp, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(I32, 0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        px = e.ptr(sg.args[3], args[3], args[4], args[5])
        # ls_s = (nibble s of the 4 scales_l bytes) | ((scales_h >> 2 s) & 3) << 4, minus 32,
        # as int32 with the even sub-blocks in the low 128-bit lane and the odd in the high (the
        # order is in the shift counts), so each pair's int16 splat is one in-lane vpshufb
        order = [0, 2, 4, 6, 1, 3, 5, 7]
        lo = b.and_(
            b.lshr(e.bcast(e.load(pw, I32, 4), V8I32), e.const(V8I32, [4 * s for s in order])),
            e.splat(V8I32, 15),
        )
        sh = e.bcast(b.zext(e.load(pw, I16, 2), I32), V8I32)
        hi = b.and_(b.lshr(sh, e.const(V8I32, [2 * s for s in order])), e.splat(V8I32, 3))
        ls = b.sub(b.or_(lo, b.shl(hi, e.splat(V8I32, 4))), e.splat(V8I32, 32))
        ls = b.bitcast(ls, V32I8)  # the low int16 of each int32 lane is ls_s
        kv = e.const(V32I8, _KV)
        acc = e.splat(V8I32, 0)
        for c in range(4):  # sub-blocks 2c, 2c+1
            qlo, qhi = e.nibbles(e.load(pw, V32I8, 8 + 32 * c))
            xlo = concat16(e, e.load(px, V16I8, 64 * c), e.load(px, V16I8, 64 * c + 32))
            xhi = concat16(e, e.load(px, V16I8, 64 * c + 16), e.load(px, V16I8, 64 * c + 48))
            s = b.bitcast(e.pshufb(ls, e.const(V32I8, [4 * c, 4 * c + 1] * 16)), V16I16)
            acc = b.add(acc, e.madd(_sdot(e, e.pshufb(kv, qlo), xlo), s))
            acc = b.add(acc, e.madd(_sdot(e, e.pshufb(kv, qhi), xhi), s))
        return e.hsum(acc)

    return sig, codegen


@njit(cache=True)
def dot_iq4_xs_avx2(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // IQ4_BB):
        o = b * IQ4_BB
        isum = _blk_iq4_xs(w, r, o, xq, a, 256 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum)
    return acc


def _phadd(e, a, b):
    """vphaddd: per 128-bit lane, [a0+a1, a2+a3, b0+b1, b2+b3] (int32, exact here)."""
    return e._call("llvm.x86.avx2.phadd.d", V8I32, [a, b])


@intrinsic
def _blk_q8_0x8(typingctx, acc, w, r, o, xq, a, xo, xd, bo):
    """acc + the 8 Q8_0 blocks at w[r, o:o+272], added one at a time in block order: each block
    as the portable kernel takes it, float32(sum w x) * (d_w d_x), so the same bits. The eight
    integer sums come out of one tree of vphaddd (a vector of the 8 blocks' sums), the eight
    scales out of one vcvtph2ps and one multiply; only the adds into acc stay scalar."""
    sig = types.float32(
        types.float32, w, types.intp, types.intp, xq, types.intp, types.intp, xd, types.intp
    )

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        f32 = ir.FloatType()
        v8f = ir.VectorType(f32, 8)
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(f32, 0)
        acc, args, tys = args[0], args[1:], sg.args[1:]
        pw = e.ptr(tys[0], args[0], args[1], args[2])
        px = e.ptr(tys[3], args[3], args[4], args[5])
        pd = e.ptr(tys[6], args[6], args[4], args[7])
        ones = e.splat(V16I16, 1)
        s = []
        hv = ir.Constant(_V8I16, None)
        for k in range(8):
            wv = e.load(pw, V32I8, Q8_BB * k + 2)
            s.append(e.madd(_sdot(e, wv, e.load(px, V32I8, 32 * k)), ones))  # 8 int32 partials
            hv = b.insert_element(hv, e.load(pw, I16, Q8_BB * k), ir.Constant(I32, k))
        # two vphaddd levels: q0 holds blocks 0-3's low-lane sums then their high-lane sums,
        # q1 blocks 4-7's; the halves added give the 8 blocks' sums in order
        q0 = _phadd(e, _phadd(e, s[0], s[1]), _phadd(e, s[2], s[3]))
        q1 = _phadd(e, _phadd(e, s[4], s[5]), _phadd(e, s[6], s[7]))
        mask = ir.VectorType(I32, 8)
        lo = b.shuffle_vector(q0, q1, ir.Constant(mask, [0, 1, 2, 3, 8, 9, 10, 11]))
        hi = b.shuffle_vector(q0, q1, ir.Constant(mask, [4, 5, 6, 7, 12, 13, 14, 15]))
        sums = b.sitofp(b.add(lo, hi), v8f)
        dw = b.fpext(b.bitcast(hv, ir.VectorType(ir.HalfType(), 8)), v8f)  # vcvtph2ps ymm
        p = b.fmul(sums, b.fmul(dw, e.load(pd, v8f)))
        for k in range(8):
            acc = b.fadd(acc, b.extract_element(p, ir.Constant(I32, k)))
        return acc

    return sig, codegen


@njit(cache=True)
def dot_q8_0_avx2(w, r, xq, xd, xb, x8, xf, a):
    nb = w.shape[1] // Q8_BB
    acc = np.float32(0.0)
    for b in range(0, nb - 7, 8):  # eight blocks (256 weights) per step
        acc = _blk_q8_0x8(acc, w, r, b * Q8_BB, xq, a, 32 * b, xd, b)
    for b in range(nb - nb % 8, nb):  # rows that are not a multiple of 256
        s = 0
        for i in range(32):
            s += np.int8(w[r, b * Q8_BB + 2 + i]) * xq[a, 32 * b + i]
        acc += np.float32(f16_at(w, r, b * Q8_BB) * xd[a, b]) * np.float32(s)
    return acc
