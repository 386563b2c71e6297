"""IQ3_XXS, IQ2_XXS and IQ1_M on the GGUF bytes (1.0x, no repack): AVX2 gathers, SIMD signs.

Every 32 weights need their grid rows from a table: IQ3_XXS 8 rows of 4 magnitudes (1 KB table,
one vpgatherdd), IQ2_XXS 4 rows of 8 (2 KB, one vpgatherdq), IQ1_M 4 rows of 8 ternary values
stored as g + 1 (16 KB, one vpgatherdq; its 11-bit indices are built with SIMD shifts). Everything
else avoids per-weight tables:

- signs (IQ3_XXS, IQ2_XXS): the 32 seven-bit ksigns fields of a super-block become 32 bytes at
  once, their 8th bit (the parity) from two vpshufb of a 16-entry table; each sub-block then
  takes one vpshufb + test to get its 32 sign masks, applied to the activation as (x ^ m) - m
  (Q8_K quants are within +-127, so this is exact);
- scales: the vpmaddwd multiplier of a sub-block is a 32-byte row of a small constant table
  indexed by its scale bits, a folded memory operand (no shuffle per sub-block).

vpmaddubsw gets the non-negative grid values (<= 62, <= 43, or g + 1 <= 2): never saturating.
IQ1_M: 8 sum(g x) + delta X8 per group of 8 = 8 sum((g + 1) x) + (delta - 8) X8 (X8: sums of 8
activation quants), as the T2 kernel does it, so the integer sums equal `iq1.dot_iq1_m`'s; the
float steps per block are the portable kernels' (results bit-identical).

Measured on Zen 3 (scalar loads + vpinsr instead of gathers were no faster there, and Intel
cores gather relatively faster, so there is one form). Plain twins (and the test oracles):
`iq3.dot_iq3_xxs`, `iq2.dot_iq2_xxs`, `iq1.dot_iq1_m`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.iq1 import iq1m_d
from strata.cpu.kernels.simd import (
    HAS_AVX2,
    I8,
    I16,
    I32,
    I64,
    V8I32,
    V16I16,
    V32I8,
    Emit,
    const_table,
)
from strata.cpu.kernels.tables import IQ1S_GRID, IQ2XXS_GRID, IQ3XXS_GRID

IQ3_BB, IQ2_BB, IQ1_BB = 98, 66, 56
_V8I8 = ir.VectorType(I8, 8)
_V4I32 = ir.VectorType(I32, 4)
_V4I64 = ir.VectorType(I64, 4)
_V8I16 = ir.VectorType(I16, 8)
_V4I16 = ir.VectorType(I16, 4)

_IQ3_U32 = [int(v) for v in IQ3XXS_GRID.copy().view("<u4")[:, 0]]
_IQ2_U64 = [int(v) for v in IQ2XXS_GRID.copy().view("<u8")[:, 0]]
_IQ1_U64 = [int(v) for v in (IQ1S_GRID.astype(np.int16) + 1).astype(np.uint8).view("<u8")[:, 0]]
# -128 (0x80) where the 4-bit value has odd parity: the ksigns 8th bit, from two nibble lookups
_PARITY = [-128 if bin(n).count("1") & 1 else 0 for n in range(16)] * 2
_BITS = [(1 << j) - (256 if j == 7 else 0) for j in range(8)] * 4  # byte 8 g + j: bit j
# vpmaddwd multipliers read from memory: IQ3_XXS/IQ2_XXS row ls = 2 ls + 1 in all 16 lanes;
# IQ1_M row a | b << 3 = 8 (2 a + 1) in the low 8 lanes (weights 0..15 of 32), 8 (2 b + 1) high
_SC_LS = [2 * ls + 1 for ls in range(16) for _ in range(16)]
_SC_IQ1 = [8 * (2 * ((k >> (3 * (i // 8))) & 7) + 1) for k in range(64) for i in range(16)]


# ---------------------------------------------------------------- IR pieces


def _gather(e: Emit, table, idx):
    """Table rows at i32 indices: <8 x i32> idx -> u32 rows (vpgatherdd), <4 x i32> -> u64 rows
    (vpgatherdq); as 32 bytes."""
    if idx.type.count == 8:
        fty = ir.FunctionType(V8I32, [V8I32, I8.as_pointer(), V8I32, V8I32, I8])
        name, ty, scale = "llvm.x86.avx2.gather.d.d.256", V8I32, 4
    else:
        fty = ir.FunctionType(_V4I64, [_V4I64, I8.as_pointer(), _V4I32, _V4I64, I8])
        name, ty, scale = "llvm.x86.avx2.gather.d.q.256", _V4I64, 8
    fn = cgutils.get_or_insert_function(e.mod, fty, name)
    z, ones = ir.Constant(ty, [0] * ty.count), ir.Constant(ty, [-1] * ty.count)
    return e.b.bitcast(e.b.call(fn, [z, table, idx, ones, ir.Constant(I8, scale)]), V32I8)


def _sign_bytes(e: Emit, aux):
    """The ksigns bytes of a super-block from its 8 aux words (4 x 7 sign bits each), arranged
    for vpshufb: lane 0 byte 2 s + h = group h of sub-block s, lane 1 byte 2 s + h = group 2 + h."""
    b = e.b
    f = b.and_(aux, e.splat(V8I32, 0x7F))
    for g in (1, 2, 3):
        f = b.or_(f, b.and_(b.shl(aux, e.splat(V8I32, g)), e.splat(V8I32, 0x7F << (8 * g))))
    fb = b.bitcast(f, V32I8)  # dword s: the four 7-bit fields as bytes
    lo = b.and_(fb, e.splat(V32I8, 15))
    hi = b.bitcast(b.lshr(b.bitcast(f, V16I16), e.splat(V16I16, 4)), V32I8)
    hi = b.and_(hi, e.splat(V32I8, 15))
    par = e.const(V32I8, _PARITY)
    full = b.or_(fb, b.xor(e.pshufb(par, lo), e.pshufb(par, hi)))
    lanes = [[4 * s + h + 2 * lane for s in range(8) for h in (0, 1)] for lane in (0, 1)]
    return e.shuffle(full, lanes[0] + lanes[1])


def _signed_x(e: Emit, sg, s, x):
    """x with the signs of sub-block s (from `_sign_bytes`) applied."""
    b = e.b
    sel = e.const(V32I8, ([2 * s] * 8 + [2 * s + 1] * 8) * 2)
    bits = e.const(V32I8, _BITS)
    neg = b.sext(b.icmp_unsigned("!=", b.and_(e.pshufb(sg, sel), bits), e.splat(V32I8, 0)), V32I8)
    return b.sub(b.xor(x, neg), neg)


def _sc_row(e: Emit, table, key):
    """Row `key` (an i64) of a table of 16 x i16 rows: a vpmaddwd multiplier."""
    return e.b.load(e.b.gep(e.b.bitcast(table, V16I16.as_pointer()), [key]), align=32)


def _ls(e: Emit, p, off):
    """The 4-bit scale of the aux word at p + off, as an i64."""
    return e.b.lshr(e.b.zext(e.load(p, I32, off), I64), ir.Constant(I64, 28))


# ---------------------------------------------------------------- block kernels


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
        grid = const_table(e, "strata_iq3xxs_grid_u32", I32, _IQ3_U32)
        sct = const_table(e, "strata_sc_ls_i16", I16, _SC_LS)
        sgn = _sign_bytes(e, e.load(pw, V8I32, 66))
        acc = e.splat(V8I32, 0)
        for s in range(8):  # 32 weights: 8 grid indices, one aux word
            mag = _gather(e, grid, b.zext(e.load(pw, _V8I8, 2 + 8 * s), V8I32))
            p = e.maddubs(mag, _signed_x(e, sgn, s, e.load(px, V32I8, 32 * s)))
            acc = b.add(acc, e.madd(p, _sc_row(e, sct, _ls(e, pw, 66 + 4 * s))))
        return e.hsum(acc)

    return sig, codegen


@intrinsic
def _blk_iq2_xxs(typingctx, w, r, o, xq, a, xo):
    """sum_s (2 ls_s + 1) sum_{i in s} g_i s_i x_i over the IQ2_XXS block at w[r, o:o+66]."""
    sig = types.int32(w, types.intp, types.intp, xq, types.intp, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(I32, 0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        px = e.ptr(sg.args[3], args[3], args[4], args[5])
        grid = const_table(e, "strata_iq2xxs_grid_u64", I64, _IQ2_U64)
        sct = const_table(e, "strata_sc_ls_i16", I16, _SC_LS)
        # sub-block s: a u32 of 4 grid indices, then its aux word (4 x 7 signs + scale)
        w0, w1 = e.load(pw, V8I32, 2), e.load(pw, V8I32, 34)
        aux = b.shuffle_vector(w0, w1, ir.Constant(V8I32, list(range(1, 16, 2))))
        sgn = _sign_bytes(e, aux)
        acc = e.splat(V8I32, 0)
        for s in range(8):
            g = _gather(e, grid, b.zext(e.load(pw, ir.VectorType(I8, 4), 2 + 8 * s), _V4I32))
            p = e.maddubs(g, _signed_x(e, sgn, s, e.load(px, V32I8, 32 * s)))
            acc = b.add(acc, e.madd(p, _sc_row(e, sct, _ls(e, pw, 6 + 8 * s))))
        return e.hsum(acc)

    return sig, codegen


@intrinsic
def _blk_iq1_m(typingctx, w, r, o, xq, a, xo, x8, go):
    """sum_s (2 ls_s + 1) sum_{g in s} (8 sum(grid_g x) + delta_g X8_g) over the IQ1_M block at
    w[r, o:o+56] (s: 16 weights, g: 8 weights)."""
    sig = types.int32(w, types.intp, types.intp, xq, types.intp, types.intp, x8, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(I32, 0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        px = e.ptr(sg.args[3], args[3], args[4], args[5])
        p8 = e.ptr(sg.args[6], args[6], args[4], args[7])
        grid = const_table(e, "strata_iq1s_grid_u_u64", I64, _IQ1_U64)
        sct = const_table(e, "strata_sc_iq1m_i16", I16, _SC_IQ1)
        acc = e.splat(V8I32, 0)
        for q in range(4):  # 64 weights: groups 8q..8q+7, index bytes 8q.., qh bytes 32+4q..
            lo = b.zext(e.load(pw, _V8I8, 8 * q), V8I32)
            h = e.bcast(e.load(pw, I32, 32 + 4 * q), V8I32)
            h = b.and_(b.lshr(h, e.const(V8I32, range(0, 32, 4))), e.splat(V8I32, 7))
            idx = b.or_(lo, b.shl(h, e.splat(V8I32, 8)))  # 11-bit grid indices
            for k in (0, 1):
                j = 2 * q + k  # 32 weights: scales 2 j and 2 j + 1, 6 bits of scale word j // 2
                g = _gather(e, grid, e.shuffle(idx, range(4 * k, 4 * k + 4)))
                p = e.maddubs(g, e.load(px, V32I8, 32 * j))
                word = b.zext(e.load(pw, I16, 48 + 2 * (j // 2)), I64)
                key = b.and_(b.lshr(word, ir.Constant(I64, 6 * (j % 2))), ir.Constant(I64, 63))
                acc = b.add(acc, e.madd(p, _sc_row(e, sct, key)))
        # the delta/offset term, sc_{g/2} (delta_g - 8) X8_g with delta_g = -1 where bit 3 of
        # the group's qh nibble is set; 16 scales 2 ls + 1 as the T2 kernel gets them
        words = e.shuffle(e.load(pw, _V4I16, 48), [s // 4 for s in range(16)])
        top = b.mul(words, e.const(V16I16, [1 << (13 - 3 * (s % 4)) for s in range(16)]))
        sc = b.lshr(top, e.splat(V16I16, 13))
        sc = b.or_(b.shl(sc, e.splat(V16I16, 1)), e.splat(V16I16, 1))
        pick = e.const(V16I16, [8 << (4 * (g & 1)) for g in range(16)])
        for h in range(2):
            qh = b.zext(e.load(pw, _V8I8, 32 + 8 * h), _V8I16)
            qh = e.shuffle(qh, [g // 2 for g in range(16)])
            neg = b.sext(b.icmp_unsigned("!=", b.and_(qh, pick), e.splat(V16I16, 0)), V16I16)
            coef = b.add(e.splat(V16I16, -7), b.shl(neg, e.splat(V16I16, 1)))
            scg = e.shuffle(sc, [8 * h + g // 2 for g in range(16)])
            acc = b.add(acc, e.madd(e.load(p8, V16I16, 32 * h), b.mul(coef, scg)))
        return e.hsum(acc)

    return sig, codegen


# ---------------------------------------------------------------- row kernels (the float steps
# of the portable twins, in the same order)


@njit(cache=True)
def dot_iq3_xxs_gather(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // IQ3_BB):
        o = b * IQ3_BB
        isum = _blk_iq3_xxs(w, r, o, xq, a, 256 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.25)
    return acc


@njit(cache=True)
def dot_iq2_xxs_gather(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // IQ2_BB):
        o = b * IQ2_BB
        isum = _blk_iq2_xxs(w, r, o, xq, a, 256 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.125)
    return acc


@njit(cache=True)
def dot_iq1_m_gather(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // IQ1_BB):
        o = b * IQ1_BB
        isum = _blk_iq1_m(w, r, o, xq, a, 256 * b, x8, 32 * b)
        acc += np.float32(xd[a, b] * iq1m_d(w, r, o)) * np.float32(isum) * np.float32(0.125)
    return acc
