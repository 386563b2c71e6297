"""MXFP4 on the GGUF bytes with AVX2: a row's 8-block groups (256 weights) in one compiled loop,
then its last blocks (rows not a multiple of 256) one 256-bit pass each.

Two blocks a 256-bit vector: their 16 code bytes joined by vinserti128, the low nibbles
(weights 0-15 of each) and the high ones (16-31) turned into E2M1 values by one vpshufb of the
16-entry table each, against the matching 16-byte halves of the two blocks' activations. The
table holds the doubled E2M1 values + 12 (0..24, unsigned), so vpmaddubsw takes the codes as they
come (no vpabsb/vpsignb) and each block's sum drops 12 sum(x), sum(x) from the Q8_0 activation's
sums of 16 (xb). The eight integer sums come out of an unpack/add transpose, the eight scales
(GGML_E8M0_TO_FP32_HALF, from the eight exponent bytes gathered in one xmm and widened by
vpmovzxbd) out of one vector multiply, and the products go into one vector of eight accumulators
(block k of a group into lane k), summed by halves once at the row's end: the portable kernel's
order (`dot_mxfp4`, LANES), so the same bits.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.mxfp4.portable import BB
from strata.cpu.kernels.simd import I8, I16, I32, I64, V8I32, V16I8, V16I16, V32I8, Emit, concat16
from strata.cpu.kernels.tables import KVALUES_MXFP4

_KU = [int(v) + 12 for v in KVALUES_MXFP4] * 2  # vpmaddubsw's u8 operand: 2 x 24 x 128 < 2**15
_F32 = ir.FloatType()
_V8F = ir.VectorType(_F32, 8)


def _mix(b, x, y, lanes):
    """shufflevector of two <8 x i32>."""
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, 8), lanes))


def _group(e, pw, px, pd, pb):
    """The 8 block products of the group at pw (codes), px (x), pd (d_x), pb (sums of 16 x):
    float32(d_x e8m0_half(e)) * float32(sum w x) as <8 x float>, block k in lane k."""
    b = e.b
    ku = e.const(V32I8, _KU)
    m4 = e.splat(V32I8, 0x0F)
    ones = e.splat(V16I16, 1)
    s = []
    for k in range(0, 8, 2):  # blocks k, k + 1 in the low and high 128-bit lanes
        q = concat16(e, e.load(pw, V16I8, BB * k + 1), e.load(pw, V16I8, BB * k + BB + 1))
        wlo = e.pshufb(ku, b.and_(q, m4))  # weights 0-15 of each block, + 12
        whi = e.pshufb(ku, b.and_(b.lshr(q, e.splat(V32I8, 4)), m4))  # weights 16-31
        xlo = concat16(e, e.load(px, V16I8, 32 * k), e.load(px, V16I8, 32 * k + 32))
        xhi = concat16(e, e.load(px, V16I8, 32 * k + 16), e.load(px, V16I8, 32 * k + 48))
        s16 = b.add(e.maddubs(wlo, xlo), e.maddubs(whi, xhi))  # |pair sums| <= 2 x 6144
        s.append(e.madd(s16, ones))  # 4 int32 partials of block k, then 4 of block k + 1
    # transpose-add: per 128-bit lane, [blocks 0, 2, 4, 6] low, [1, 3, 5, 7] high; then in order
    lo, hi = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    u01 = b.add(_mix(b, s[0], s[1], lo), _mix(b, s[0], s[1], hi))
    u23 = b.add(_mix(b, s[2], s[3], lo), _mix(b, s[2], s[3], hi))
    q = b.add(
        _mix(b, u01, u23, [0, 1, 8, 9, 4, 5, 12, 13]),
        _mix(b, u01, u23, [2, 3, 10, 11, 6, 7, 14, 15]),
    )
    q = e.shuffle(q, [0, 4, 1, 5, 2, 6, 3, 7])
    q = b.sub(q, e.madd(e.load(pb, V16I16), e.splat(V16I16, 12)))  # the table's +12: 12 sum(x)
    # the 8 exponent bytes as one int64, widened by vpmovzxbd (LLVM emits vpinsrb from memory:
    # ~1.13x the speed of eight vpinsrd of zero-extended bytes)
    pk = b.zext(e.load(pw, I8, 0), I64)
    for k in range(1, 8):
        pk = b.or_(pk, b.shl(b.zext(e.load(pw, I8, BB * k), I64), ir.Constant(I64, 8 * k)))
    v2 = b.insert_element(ir.Constant(ir.VectorType(I64, 2), None), pk, ir.Constant(I32, 0))
    ev = b.zext(e.shuffle(b.bitcast(v2, V16I8), list(range(8))), V8I32)
    dw = _e8m0_half(e, ev, V8I32, _V8F)
    return b.fmul(b.sitofp(q, _V8F), b.fmul(e.load(pd, _V8F), dw))


def _e8m0_half(e, ev, ity, fty):
    """e8m0_half of the int32 exponents ev (a vector or a scalar): (e - 1) << 23, or
    0x00200000 << e for e < 2 (the two subnormals)."""
    b = e.b

    def c(v):
        return e.splat(ity, v) if isinstance(ity, ir.VectorType) else ir.Constant(ity, v)

    norm = b.shl(b.sub(ev, c(1)), c(23))
    sub = b.shl(c(0x00200000), ev)
    return b.bitcast(b.select(b.icmp_unsigned("<", ev, c(2)), sub, norm), fty)


def _block(e, pw, px, pd, pb):
    """float32(d_x e8m0_half(e)) * float32(sum w x) of the one block at pw (a row's tail)."""
    b = e.b
    q = e.load(pw, V16I8, 1)
    m4 = e.splat(V16I8, 0x0F)
    idx = concat16(e, b.and_(q, m4), b.and_(b.lshr(q, e.splat(V16I8, 4)), m4))  # weights 0..31
    s16 = e.maddubs(e.pshufb(e.const(V32I8, _KU), idx), e.load(px, V32I8, 0))
    s = e.hsum(e.madd(s16, e.splat(V16I16, 1)))
    bs = b.add(b.sext(e.load(pb, I16, 0), I32), b.sext(e.load(pb, I16, 2), I32))
    s = b.sub(s, b.mul(bs, ir.Constant(I32, 12)))
    dw = _e8m0_half(e, b.zext(e.load(pw, I8, 0), I32), I32, _F32)
    return b.fmul(b.fmul(e.load(pd, _F32), dw), b.sitofp(s, _F32))


@intrinsic
def _row_mxfp4(typingctx, w, r, xq, a, xd, xb, nb):
    """Row r (nb blocks) against act row a, as the portable kernel sums it: block k of each
    8-block group into accumulator k, the eight summed by halves (`group_sum`), then the blocks
    past the last group one at a time, each in one 256-bit pass (the scalar `block_term` ran
    at ~1.9 Gweights/s: gpt-oss rows of 2880 have two such blocks)."""
    sig = types.float32(w, types.intp, xq, types.intp, xd, xb, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(_F32, 0)
        w_, r_, xq_, a_, xd_, xb_, nb = args
        zero = ir.Constant(I64, 0)
        pw0 = e.ptr(sg.args[0], w_, r_, zero)
        px0 = e.ptr(sg.args[2], xq_, a_, zero)
        pd0 = e.ptr(sg.args[4], xd_, a_, zero)
        pb0 = e.ptr(sg.args[5], xb_, a_, zero)
        accp = cgutils.alloca_once_value(b, ir.Constant(_V8F, [0.0] * 8))
        ng = b.lshr(nb, ir.Constant(I64, 3))
        with cgutils.for_range(b, ng) as loop:
            g = loop.index
            p = _group(
                e,
                e.off(pw0, b.mul(g, ir.Constant(I64, 8 * BB))),
                e.off(px0, b.mul(g, ir.Constant(I64, 256))),
                e.off(pd0, b.mul(g, ir.Constant(I64, 32))),  # 8 float32
                e.off(pb0, b.mul(g, ir.Constant(I64, 32))),  # 16 int16
            )
            b.store(b.fadd(b.load(accp), p), accp)
        acc = b.load(accp)
        h = b.fadd(e.shuffle(acc, [0, 1, 2, 3]), e.shuffle(acc, [4, 5, 6, 7]))
        q2 = b.fadd(e.shuffle(h, [0, 1]), e.shuffle(h, [2, 3]))
        total = b.fadd(
            b.extract_element(q2, ir.Constant(I32, 0)), b.extract_element(q2, ir.Constant(I32, 1))
        )
        totp = cgutils.alloca_once_value(b, total)
        b0 = b.shl(ng, ir.Constant(I64, 3))
        with cgutils.for_range(b, b.sub(nb, b0)) as loop:
            k = b.add(b0, loop.index)
            p = _block(
                e,
                e.off(pw0, b.mul(k, ir.Constant(I64, BB))),
                e.off(px0, b.mul(k, ir.Constant(I64, 32))),
                e.off(pd0, b.mul(k, ir.Constant(I64, 4))),
                e.off(pb0, b.mul(k, ir.Constant(I64, 4))),  # two int16
            )
            b.store(b.fadd(b.load(totp), p), totp)
        return b.load(totp)

    return sig, codegen


# inlined where it is called (with `dispatch.dot`, inlined too): the body is over LLVM's inlining
# threshold, and a call passes the seven act and weight arrays field by field (~60 words) per
# row; the pool's MXFP4 layer 1.7-2.8x faster on 2 EPYC cores
@njit(cache=True, inline="always")
def dot_mxfp4_avx2(w, r, xq, xd, xb, x8, xf, a):
    return _row_mxfp4(w, r, xq, a, xd, xb, w.shape[1] // BB)
