"""Tiles of activation rows: a weight row against up to TILE rows, each block decoded once.

    T = activation rows (tokens), C = columns, n = rows of a tile (<= TILE)

A prompt runs each weight row against many activation rows. The one-row kernels (lut4.py,
kquants/avx2.py) decode a block (nibbles, LUT lookups, scale splats) and pay a call for every
row they meet; here one call takes the row against n activation rows rows[0..n-1] of xq [T, C]:
per super-block the decoded weights and scale splats are made once and held in registers while
a loop over the n rows runs only the vpmaddubsw/vpmaddwd work. The integer sums and the float
steps are the one-row kernels', so `dotn` gives `dot`'s bits for every row (tests hold them
equal: tests/test_cpu_kernels.py) and decode and prompt agree.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.kquants.avx2 import q6_k_unpack
from strata.cpu.kernels.kquants.portable import Q6K_BB
from strata.cpu.kernels.lut4 import BB, CODE_VALUES
from strata.cpu.kernels.simd import I32, I64, V8I32, V16I16, V32I8, Emit

TILE = 32  # activation rows a call at most


@intrinsic
def stack_buffer(typingctx, dtype_of):
    """A pointer to TILE elements of dtype_of's type on the caller's stack (its frame: the
    intrinsic is inlined), for `numba.carray`: scratch without an allocation."""
    ty = dtype_of
    sig = types.CPointer(ty)(ty)

    def codegen(context, builder, sg, args):
        return cgutils.alloca_once(builder, context.get_data_type(ty), size=TILE)

    return sig, codegen


def _row_loop(e, sg, args, ix, io, ib, ibo, irows, n, isum, body):
    """For i < n: a = rows[i]; isum[i] = body(x pointer of xq row a at column args[io], its bsum
    pointer in xb at column args[ibo]) (int32)."""
    b = e.b
    with cgutils.for_range(b, n) as loop:
        i = loop.index
        a = b.load(b.bitcast(e.ptr(sg.args[irows], args[irows], i), I64.as_pointer()))
        px = e.ptr(sg.args[ix], args[ix], a, args[io])
        pb = e.ptr(sg.args[ib], args[ib], a, args[ibo])
        b.store(body(px, pb), b.bitcast(e.ptr(sg.args[isum], args[isum], i), I32.as_pointer()))


@intrinsic(prefer_literal=True)
def _blkn_lut4(typingctx, w, r, qo, so, xq, xo, xb, bo, rows, n, isum, variant):
    """`lut4._blk_avx2` for rows rows[0..n-1] of xq into isum [n]: the super-block's LUT lookups
    and scale splats made once, then per row 8 vpmaddubsw + 8 vpmaddwd and the +64 correction."""
    if not isinstance(variant, types.IntegerLiteral):
        return None
    lut_values = [int(v) + 64 for v in CODE_VALUES[variant.literal_value]] * 2
    ip = types.intp
    sig = types.void(w, ip, ip, ip, xq, ip, xb, ip, rows, ip, isum, variant)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        if not HAS_AVX2:
            e.trap()
            return context.get_dummy_value()
        b = builder
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        ps = e.ptr(sg.args[0], args[0], args[1], args[3])
        s = e.bcast(e.load(ps, I32), V8I32)
        ls = b.and_(b.lshr(s, e.const(V8I32, range(0, 32, 4))), e.splat(V8I32, 15))
        sc = b.trunc(
            b.add(b.shl(ls, e.splat(V8I32, 1)), e.splat(V8I32, 1)), ir.VectorType(ir.IntType(16), 8)
        )
        sc = e.shuffle(sc, list(range(8)) * 2)
        lut = e.const(V32I8, lut_values)
        vals, scs = [], []  # per 32 weights: the looked-up bytes (level + 64), the scale splat
        for j in range(4):
            lo, hi = e.nibbles(e.load(pw, V32I8, 32 * j))
            vals += [e.pshufb(lut, lo), e.pshufb(lut, hi)]
            scs += [
                e.shuffle(sc, [2 * j] * 8 + [8 + 2 * j] * 8),
                e.shuffle(sc, [2 * j + 1] * 8 + [9 + 2 * j] * 8),
            ]
        pairs = e.shuffle(sc, [k // 2 for k in range(8)] + [12 + k // 2 for k in range(8)])

        def body(px, pb):
            acc = e.splat(V8I32, 0)
            for k in range(8):
                acc = b.add(acc, e.madd(e.maddubs(vals[k], e.load(px, V32I8, 32 * k)), scs[k]))
            corr = e.madd(e.load(pb, V16I16), pairs)
            return e.hsum(b.sub(acc, b.shl(corr, e.splat(V8I32, 6))))

        _row_loop(e, sg, args, 4, 5, 6, 7, 8, args[9], 10, body)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _blkn_q6_k(typingctx, w, r, o, xq, xo, xb, bo, rows, n, isum):
    """`kquants.avx2._blk_q6_k` for rows rows[0..n-1] of xq into isum [n]: the block's 6-bit
    quants (w[r, o:o+210]) and scale splats built once."""
    ip = types.intp
    sig = types.void(w, ip, ip, xq, ip, xb, ip, rows, ip, isum)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            return context.get_dummy_value()
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        qs, scs, sc = q6_k_unpack(e, pw)

        def body(px, pb):
            acc = e.splat(V8I32, 0)
            for k in range(8):
                acc = b.add(acc, e.madd(e.maddubs(qs[k], e.load(px, V32I8, 32 * k)), scs[k]))
            off = e.madd(e.load(pb, V16I16), sc)
            return e.hsum(b.sub(acc, b.shl(off, e.splat(V8I32, 5))))

        _row_loop(e, sg, args, 3, 4, 5, 6, 7, args[8], 9, body)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, inline="always")
def _lut4_tile(w, r, xq, xd, xb, rows, n, y, variant, factor):
    isum = numba.carray(stack_buffer(np.int32(0)), (TILE,))
    nb = w.shape[1] // BB
    f = np.float32(factor)
    for i in range(n):
        y[i] = 0.0
    for b in range(nb):
        _blkn_lut4(w, r, 128 * b, 128 * nb + 4 * b, xq, 256 * b, xb, 16 * b, rows, n, isum, variant)
        d = f16_at(w, r, 132 * nb + 2 * b)
        for i in range(n):
            y[i] += np.float32(xd[rows[i], b] * d) * np.float32(isum[i]) * f


@njit(cache=True)
def dotn_lut4_avx2(w, r, xq, xd, xb, x8, xf, rows, n, y):
    """IQ3_XXS in the LUT4 layout: y[i] = `lut4.dot_lut4_avx2` on act row rows[i], i < n."""
    _lut4_tile(w, r, xq, xd, xb, rows, n, y, 0, 0.25)


@njit(cache=True)
def dotn_lut4_s_avx2(w, r, xq, xd, xb, x8, xf, rows, n, y):
    """IQ3_S in the LUT4 layout: y[i] = `lut4.dot_lut4_s_avx2` on act row rows[i], i < n."""
    _lut4_tile(w, r, xq, xd, xb, rows, n, y, 1, 1.0)


@njit(cache=True)
def dotn_lut4_2xxs_avx2(w, r, xq, xd, xb, x8, xf, rows, n, y):
    """IQ2_XXS in the LUT4 layout: y[i] = `lut4.dot_lut4_2xxs_avx2` on act row rows[i], i < n."""
    _lut4_tile(w, r, xq, xd, xb, rows, n, y, 2, 0.125)


@njit(cache=True)
def dotn_q6_k_avx2(w, r, xq, xd, xb, x8, xf, rows, n, y):
    """Q6_K on the GGUF bytes: y[i] = `kquants.avx2.dot_q6_k_avx2` on act row rows[i], i < n."""
    isum = numba.carray(stack_buffer(np.int32(0)), (TILE,))
    for i in range(n):
        y[i] = 0.0
    for b in range(w.shape[1] // Q6K_BB):
        o = b * Q6K_BB
        _blkn_q6_k(w, r, o, xq, 256 * b, xb, 16 * b, rows, n, isum)
        d = f16_at(w, r, o + 208)
        for i in range(n):
            y[i] += np.float32(xd[rows[i], b] * d) * np.float32(isum[i])


@njit(cache=True)
def dotn_f32(w, r, xq, xd, xb, x8, xf, rows, n, y):
    """F32 weights: y[i] = `floats.dot_f32` on act row rows[i], i < n. Eight rows a pass: eight
    independent float64 sums (one sum is a chain of dependent adds, latency-bound)."""
    wr = w[r].view(np.float32)  # [C]
    c = wr.shape[0]
    i = 0
    while i + 8 <= n:
        x0, x1, x2, x3 = xf[rows[i]], xf[rows[i + 1]], xf[rows[i + 2]], xf[rows[i + 3]]
        x4, x5, x6, x7 = xf[rows[i + 4]], xf[rows[i + 5]], xf[rows[i + 6]], xf[rows[i + 7]]
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
        for k in range(c):
            v = wr[k]
            s0 += v * x0[k]
            s1 += v * x1[k]
            s2 += v * x2[k]
            s3 += v * x3[k]
            s4 += v * x4[k]
            s5 += v * x5[k]
            s6 += v * x6[k]
            s7 += v * x7[k]
        y[i], y[i + 1], y[i + 2], y[i + 3] = s0, s1, s2, s3
        y[i + 4], y[i + 5], y[i + 6], y[i + 7] = s4, s5, s6, s7
        i += 8
    while i < n:
        xa = xf[rows[i]]
        s = 0.0
        for k in range(c):
            s += wr[k] * xa[k]
        y[i] = s
        i += 1
