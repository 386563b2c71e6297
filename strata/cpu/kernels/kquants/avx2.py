"""Q4_K, Q5_K and Q6_K on the GGUF bytes with AVX2 (no repack: 32 weights per load already).

Q4_K/Q5_K per super-block: the 12 scale bytes unpack to 8 scales + 8 mins with ggml's utmp
mask/shift steps done on one xmm; each 32-byte load of quants feeds two vpmaddubsw (low and high
nibbles, Q5_K's fifth bit or-ed in) and vpmaddwd by the sub-block scale (one vpshufb splat);
the mins meet the Q8_K bsums in one vpmaddwd, and both sums are reduced together. Q6_K: 6-bit
quants (0..63) from ql nibbles and qh pairs, 16 int8 scales per 16 weights, the -32 offset
through the bsums. Quants stay <= 63, so
vpmaddubsw cannot saturate. The plain twins are in `kquants`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.kquants.portable import Q4K_BB, Q5K_BB, Q6K_BB, kmin_block
from strata.cpu.kernels.simd import I32, V8I32, V16I16, V32I8, Emit

_V4I32 = ir.VectorType(I32, 4)
_V16I8 = ir.VectorType(ir.IntType(8), 16)


def _mix(b, x, y, lanes):
    """shufflevector of two vectors of one type."""
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, len(lanes)), lanes))


def _k4_scales(e, pw):
    """<32 x i8>: in each 128-bit lane, bytes 0..7 the scales, 8..15 the mins of the k4-packed
    bytes at pw + 4 (ggml's utmp trick on the three words in one xmm: lane k of the result is
    the utmp[k] ggml builds), both lanes alike for the in-lane vpshufb splats."""
    b = e.b
    u = e.load(pw, _V4I32, 4)  # [u0, u1, u2, -] (the 4th word: quants, unused)
    k1, k2, k3 = 0x3F3F3F3F, 0x0F0F0F0F, 0x30303030
    lo = b.and_(
        b.lshr(e.shuffle(u, [0, 2, 1, 2]), e.const(_V4I32, [0, 0, 0, 4])),
        e.const(_V4I32, [k1, k2, k1, k2]),
    )
    # the top 2 bits of u0 / u1's bytes as bits 4, 5 of the high scales / mins
    hi = b.lshr(e.shuffle(u, [0, 0, 1, 1]), e.splat(_V4I32, 2))
    hi = b.and_(hi, e.const(_V4I32, [0, k3, 0, k3]))
    sm = b.bitcast(b.or_(lo, hi), _V16I8)
    return b.bitcast(e.shuffle(sm, list(range(16)) * 2), V32I8)


def _splat16(e, sm, idx):
    """<16 x i16> whose word i is byte idx[i % len(idx)] of each lane of sm, zero-extended
    (vpshufb: a control byte of 0x80 gives 0)."""
    ctl = [c for i in range(16) for c in (idx[i % len(idx)], 0x80)]
    return e.b.bitcast(e.pshufb(sm, e.const(V32I8, ctl)), V16I16)


def _k_block(e, sg, args, bb, fifth_bit):
    """Q4_K (fifth_bit False) or Q5_K block: (isum, msum) as in `_blk_q4_k`."""
    b = e.b
    pw = e.ptr(sg.args[0], args[0], args[1], args[2])
    px = e.ptr(sg.args[3], args[3], args[4], args[5])
    pb = e.ptr(sg.args[6], args[6], args[4], args[7])
    sm = _k4_scales(e, pw)  # per lane: bytes 0..7 scales, 8..15 mins
    qo = 16 if not fifth_bit else 48
    qh = e.load(pw, V32I8, 16) if fifth_bit else None
    acc = e.splat(V8I32, 0)
    for j in range(4):
        lo, hi = e.nibbles(e.load(pw, V32I8, qo + 32 * j))
        if fifth_bit:  # bit s of qh[i] is bit 4 of weight 32 s + i
            for s, q in ((2 * j, "lo"), (2 * j + 1, "hi")):
                bit = (
                    b.shl(qh, e.splat(V32I8, 4 - s))
                    if s <= 4
                    else b.lshr(qh, e.splat(V32I8, s - 4))
                )
                bit = b.and_(bit, e.splat(V32I8, 16))
                if q == "lo":
                    lo = b.or_(lo, bit)
                else:
                    hi = b.or_(hi, bit)
        pl = e.maddubs(lo, e.load(px, V32I8, 64 * j))
        ph = e.maddubs(hi, e.load(px, V32I8, 64 * j + 32))
        acc = b.add(acc, e.madd(pl, _splat16(e, sm, [2 * j])))
        acc = b.add(acc, e.madd(ph, _splat16(e, sm, [2 * j + 1])))
    # min m_s against the bsums of its two 16-weight halves: words [m0, m0, m1, m1, ...]
    mins = e.madd(e.load(pb, V16I16), _splat16(e, sm, [8 + k // 2 for k in range(16)]))
    # both sums reduced together: [isum, msum]
    t = b.add(
        _mix(b, acc, mins, [0, 1, 8, 9, 4, 5, 12, 13]),
        _mix(b, acc, mins, [2, 3, 10, 11, 6, 7, 14, 15]),
    )
    t = b.add(_mix(b, t, t, [0, 1, 2, 3]), _mix(b, t, t, [4, 5, 6, 7]))  # [i, i, m, m]
    t = b.add(_mix(b, t, t, [0, 2]), _mix(b, t, t, [1, 3]))
    return b.extract_element(t, ir.Constant(I32, 0)), b.extract_element(t, ir.Constant(I32, 1))


@intrinsic
def _blk_q4_k(typingctx, w, r, o, xq, a, xo, xb, bo):
    """(sum_s sc_s sum q x, sum_s m_s bsum_s) of the Q4_K block at w[r, o:o+144] (int32s)."""
    ret = types.UniTuple(types.int32, 2)
    sig = ret(w, types.intp, types.intp, xq, types.intp, types.intp, xb, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        if not HAS_AVX2:
            e.trap()
            zero = ir.Constant(I32, 0)
            return context.make_tuple(builder, ret, [zero, zero])
        return context.make_tuple(builder, ret, list(_k_block(e, sg, args, Q4K_BB, False)))

    return sig, codegen


@njit(cache=True)
def dot_q4_k_avx2(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q4K_BB):
        o = b * Q4K_BB
        isum, msum = _blk_q4_k(w, r, o, xq, a, 256 * b, xb, 16 * b)
        acc += kmin_block(w, r, o, xd[a, b], isum, msum)
    return acc


@intrinsic
def _blk_q5_k(typingctx, w, r, o, xq, a, xo, xb, bo):
    """As `_blk_q4_k` for the Q5_K block at w[r, o:o+176]."""
    ret = types.UniTuple(types.int32, 2)
    sig = ret(w, types.intp, types.intp, xq, types.intp, types.intp, xb, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        if not HAS_AVX2:
            e.trap()
            zero = ir.Constant(I32, 0)
            return context.make_tuple(builder, ret, [zero, zero])
        return context.make_tuple(builder, ret, list(_k_block(e, sg, args, Q5K_BB, True)))

    return sig, codegen


@njit(cache=True)
def dot_q5_k_avx2(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q5K_BB):
        o = b * Q5K_BB
        isum, msum = _blk_q5_k(w, r, o, xq, a, 256 * b, xb, 16 * b)
        acc += kmin_block(w, r, o, xd[a, b], isum, msum)
    return acc


def q6_k_unpack(e: Emit, pw):
    """The Q6_K block at pw: its 8 vectors of 32 quants (0..63, ql | qh << 4), each vector's
    scale pair splat [16 x i16] (even sub-block in the low 128-bit lane, odd in the high: the
    splats are lane-local), and the 16 int8 scales widened [16 x i16]."""
    b = e.b
    sc = b.sext(e.load(pw, _V16I8, 192), V16I16)  # 16 int8 scales, one per 16 weights
    sc2 = e.shuffle(sc, [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15])
    m15, m48 = e.splat(V32I8, 15), e.splat(V32I8, 0x30)
    qs, pairs = [], []
    for h in range(2):
        qh = e.load(pw, V32I8, 128 + 32 * h)
        ql = [e.load(pw, V32I8, 64 * h + 32 * c) for c in range(2)]
        for k in range(4):
            v = ql[k & 1]
            lo = b.and_(v, m15) if k < 2 else b.and_(b.lshr(v, e.splat(V32I8, 4)), m15)
            hi = (
                b.shl(qh, e.splat(V32I8, 4 - 2 * k))
                if k < 2
                else b.lshr(qh, e.splat(V32I8, 2 * k - 4))
                if k > 2
                else qh
            )
            qs.append(b.or_(lo, b.and_(hi, m48)))
            pairs.append(e.shuffle(sc2, [4 * h + k] * 8 + [8 + 4 * h + k] * 8))
    return qs, pairs, sc


@intrinsic
def _blk_q6_k(typingctx, w, r, o, xq, a, xo, xb, bo):
    """sum_s sc_s (sum q x - 32 bsum_s) of the Q6_K block at w[r, o:o+210] (int32)."""
    sig = types.int32(w, types.intp, types.intp, xq, types.intp, types.intp, xb, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(I32, 0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        px = e.ptr(sg.args[3], args[3], args[4], args[5])
        pb = e.ptr(sg.args[6], args[6], args[4], args[7])
        qs, pairs, sc = q6_k_unpack(e, pw)
        acc = e.splat(V8I32, 0)
        for k in range(8):  # 32 weights each: sub-blocks 2 k and 2 k + 1
            acc = b.add(acc, e.madd(e.maddubs(qs[k], e.load(px, V32I8, 32 * k)), pairs[k]))
        off = e.madd(e.load(pb, V16I16), sc)  # sum_s sc_s bsum_s
        acc = b.sub(acc, b.shl(off, e.splat(V8I32, 5)))
        return e.hsum(acc)

    return sig, codegen


@njit(cache=True)
def dot_q6_k_avx2(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q6K_BB):
        o = b * Q6K_BB
        isum = _blk_q6_k(w, r, o, xq, a, 256 * b, xb, 16 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o + 208)) * np.float32(isum)
    return acc
