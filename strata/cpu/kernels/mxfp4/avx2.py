"""MXFP4 on the GGUF bytes with AVX2: eight blocks (256 weights) a step.

Two blocks a 256-bit vector: their 16 code bytes joined by vinserti128, the low nibbles
(weights 0-15 of each) and the high ones (16-31) turned into doubled E2M1 values by one vpshufb
of the 16-entry table each, against the matching 16-byte halves of the two blocks' activations;
the dot is vpmaddubsw with the sign trick (|w| <= 12: exact) and vpmaddwd. As in Q8_0's
kernel, the eight integer sums come out of one vphaddd tree and the eight scales
(GGML_E8M0_TO_FP32_HALF, built from the exponent bytes by shifts and a select) out of one
vector multiply; the eight products are summed by halves and the group's sum added to the row's
accumulator: the portable kernel's order (`dot_mxfp4`, GROUP), so the same bits.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.mxfp4.portable import BB, block_term
from strata.cpu.kernels.simd import (
    I8,
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
from strata.cpu.kernels.tables import KVALUES_MXFP4

_KV = [int(v) & 0xFF for v in KVALUES_MXFP4] * 2


def _sdot(e, w, x):
    """int16 pair sums of the signed bytes w and x (vpmaddubsw with the sign trick)."""
    return e.maddubs(absb(e, w), signb(e, x, w))


def _phadd(e, a, b):
    """vphaddd: per 128-bit lane, [a0+a1, a2+a3, b0+b1, b2+b3] (int32, exact here)."""
    return e._call("llvm.x86.avx2.phadd.d", V8I32, [a, b])


@intrinsic
def _blk_mxfp4x8(typingctx, acc, w, r, o, xq, a, xo, xd, bo):
    """acc + the sum of the 8 MXFP4 blocks at w[r, o:o+136], as the portable kernel adds them:
    each float32(d_x * e8m0_half(e)) * float32(sum w x), summed by halves (`group_sum`)."""
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
        kv = e.const(V32I8, _KV)
        m4 = e.splat(V32I8, 0x0F)
        ones = e.splat(V16I16, 1)
        s = []
        for k in range(0, 8, 2):  # blocks k, k + 1 in the low and high 128-bit lanes
            q = concat16(e, e.load(pw, V16I8, BB * k + 1), e.load(pw, V16I8, BB * k + BB + 1))
            wlo = e.pshufb(kv, b.and_(q, m4))  # weights 0-15 of each block
            whi = e.pshufb(kv, b.and_(b.lshr(q, e.splat(V32I8, 4)), m4))  # weights 16-31
            xlo = concat16(e, e.load(px, V16I8, 32 * k), e.load(px, V16I8, 32 * k + 32))
            xhi = concat16(e, e.load(px, V16I8, 32 * k + 16), e.load(px, V16I8, 32 * k + 48))
            # int16 pairs: |w| <= 12, |x| <= 127, so two pair sums add without overflow
            s16 = b.add(_sdot(e, wlo, xlo), _sdot(e, whi, xhi))
            s.append(e.madd(s16, ones))  # 4 int32 partials of block k, then 4 of block k + 1
        ev = ir.Constant(V8I32, None)
        for k in range(8):
            ev = b.insert_element(ev, b.zext(e.load(pw, I8, BB * k), I32), ir.Constant(I32, k))
        # two vphaddd levels: blocks 0, 2, 4, 6 in the low lane, 1, 3, 5, 7 in the high one
        q = _phadd(e, _phadd(e, s[0], s[1]), _phadd(e, s[2], s[3]))
        sums = b.sitofp(e.shuffle(q, [0, 4, 1, 5, 2, 6, 3, 7]), v8f)
        # e8m0_half: (e - 1) << 23, or 0x00200000 << e for e < 2 (the two subnormals)
        norm = b.shl(b.sub(ev, e.splat(V8I32, 1)), e.splat(V8I32, 23))
        sub = b.shl(e.splat(V8I32, 0x00200000), ev)
        small = b.icmp_unsigned("<", ev, e.splat(V8I32, 2))
        dw = b.bitcast(b.select(small, sub, norm), v8f)
        p = b.fmul(sums, b.fmul(e.load(pd, v8f), dw))
        # the group's sum by halves (portable GROUP: three adds deep), then one add into acc:
        # the only float latency the steps chain on
        h = b.fadd(e.shuffle(p, [0, 1, 2, 3]), e.shuffle(p, [4, 5, 6, 7]))
        q2 = b.fadd(e.shuffle(h, [0, 1]), e.shuffle(h, [2, 3]))
        gs = b.fadd(
            b.extract_element(q2, ir.Constant(I32, 0)), b.extract_element(q2, ir.Constant(I32, 1))
        )
        return b.fadd(acc, gs)

    return sig, codegen


@njit(cache=True)
def dot_mxfp4_avx2(w, r, xq, xd, xb, x8, xf, a):
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(0, nb - 7, 8):  # eight blocks (256 weights) per step
        acc = _blk_mxfp4x8(acc, w, r, b * BB, xq, a, 32 * b, xd, b)
    for b in range(nb - nb % 8, nb):  # rows that are not a multiple of 256
        acc += block_term(w, r, b * BB, xq, a, 32 * b, xd[a, b])
    return acc
