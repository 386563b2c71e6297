"""MXFP4 on the GGUF bytes with AVX2: eight blocks (256 weights) a step.

Each block's 16 code bytes become 32 codes (low nibbles: weights 0-15, high: 16-31, joined by
vinserti128) and its doubled E2M1 values by one vpshufb of the 16-entry table; the dot with the
activation is vpmaddubsw with the sign trick (|w| <= 12: exact) and vpmaddwd. As in Q8_0's
kernel, the eight integer sums come out of one vphaddd tree and the eight scales
(GGML_E8M0_TO_FP32_HALF, built from the exponent bytes by shifts and a select) out of one
vector multiply; the adds into the float accumulator stay scalar and in block order, so the bits
are the portable kernel's (`mxfp4.portable.dot_mxfp4`).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.mxfp4.portable import BB, e8m0_half
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
_KVT = KVALUES_MXFP4


def _phadd(e, a, b):
    """vphaddd: per 128-bit lane, [a0+a1, a2+a3, b0+b1, b2+b3] (int32, exact here)."""
    return e._call("llvm.x86.avx2.phadd.d", V8I32, [a, b])


@intrinsic
def _blk_mxfp4x8(typingctx, acc, w, r, o, xq, a, xo, xd, bo):
    """acc + the 8 MXFP4 blocks at w[r, o:o+136], added one at a time in block order, each as
    the portable kernel takes it: float32(d_x * e8m0_half(e)) * float32(sum w x)."""
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
        m4 = e.splat(V16I8, 0x0F)
        ones = e.splat(V16I16, 1)
        s = []
        ev = ir.Constant(V8I32, None)
        for k in range(8):
            q16 = e.load(pw, V16I8, BB * k + 1)
            # low nibbles (weights 0-15) in the low 128-bit lane, high nibbles in the high one
            lo4 = b.and_(q16, m4)
            hi4 = b.and_(b.lshr(q16, e.splat(V16I8, 4)), m4)
            codes = concat16(e, lo4, hi4)
            wv = e.pshufb(kv, codes)
            xv = e.load(px, V32I8, 32 * k)
            s.append(e.madd(e.maddubs(absb(e, wv), signb(e, xv, wv)), ones))  # 8 int32 partials
            ev = b.insert_element(ev, b.zext(e.load(pw, I8, BB * k), I32), ir.Constant(I32, k))
        q0 = _phadd(e, _phadd(e, s[0], s[1]), _phadd(e, s[2], s[3]))
        q1 = _phadd(e, _phadd(e, s[4], s[5]), _phadd(e, s[6], s[7]))
        mask = ir.VectorType(I32, 8)
        lo = b.shuffle_vector(q0, q1, ir.Constant(mask, [0, 1, 2, 3, 8, 9, 10, 11]))
        hi = b.shuffle_vector(q0, q1, ir.Constant(mask, [4, 5, 6, 7, 12, 13, 14, 15]))
        sums = b.sitofp(b.add(lo, hi), v8f)
        # e8m0_half: (e - 1) << 23, or 0x00200000 << e for e < 2 (the two subnormals)
        norm = b.shl(b.sub(ev, e.splat(V8I32, 1)), e.splat(V8I32, 23))
        sub = b.shl(e.splat(V8I32, 0x00200000), ev)
        small = b.icmp_unsigned("<", ev, e.splat(V8I32, 2))
        dw = b.bitcast(b.select(small, sub, norm), v8f)
        p = b.fmul(sums, b.fmul(e.load(pd, v8f), dw))
        for k in range(8):
            acc = b.fadd(acc, b.extract_element(p, ir.Constant(I32, k)))
        return acc

    return sig, codegen


@njit(cache=True)
def dot_mxfp4_avx2(w, r, xq, xd, xb, x8, xf, a):
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(0, nb - 7, 8):  # eight blocks (256 weights) per step
        acc = _blk_mxfp4x8(acc, w, r, b * BB, xq, a, 32 * b, xd, b)
    for b in range(nb - nb % 8, nb):  # rows that are not a multiple of 256
        o = b * BB
        s = 0
        for j in range(16):
            q = w[r, o + 1 + j]
            s += _KVT[q & 15] * xq[a, 32 * b + j]
            s += _KVT[q >> 4] * xq[a, 32 * b + 16 + j]
        acc += np.float32(xd[a, b] * e8m0_half(w[r, o])) * np.float32(s)
    return acc
