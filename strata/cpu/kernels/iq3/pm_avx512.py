"""IQ3_XXS repacked position-major ("pm", 102 bytes per 256 weights, 1.04x) for AVX-512 VBMI + VNNI.

A kernel on the GGUF bytes spends most of its shuffle port on putting the weights back
in natural order (grid rows -> level nibbles -> interleaved bytes) and on expanding the 7-bit
sign fields. This layout keeps the grid indices as they are and stores the signs as plain bits in
the order the cheapest decode produces, with the activation's quants reordered to match, once per
call, by the quantizer (quantize.py: the Q8_K quants in position-major order, xf's bytes):

    [0:2]    d (f16)                   as the GGUF block
    [2:66]   qs: 64 grid indices       as the GGUF block: index g covers weights 4 g .. 4 g + 3
    [66:98]  signs: four u64           word p, bit g: sign of weight 4 g + p
    [98:102] scales: u32               nibble s: ls_s of sub-block s (weights 32 s .. 32 s + 31)

Position-major order: vector p (p = 0..3) holds, at byte g, weight 4 g + p of the super-block; so
xp[256 b + 64 p + g] = xq[256 b + 4 g + p] (`quantize.pm_order`). The kernel per super-block:

1. A[g] = l0 | l1 << 4 and B[g] = l2 | l3 << 4 (the 3-bit levels of grid row g, as avx512.py:
   two vpermi2b each and a select on bit 7 of the index).
2. level p of every g: A, A >> 4 (a word shift), B, B >> 4; the magnitude is one vpermb through a
   64-byte table whose entry i is LEVELS[i & 7] (vpermb reads 6 index bits: the neighbour's bits
   that the word shift brings into bits 4-5 select equal entries; bit 3 is always clear).
3. signs: word p of the signs is the 64-bit mask of vector p (a kmovq load): x_p negated under it.
4. vpdpbusd per p (lane j sums g = 4 j .. 4 j + 3: weights 16 j + p + {0, 4, 8, 12}, all in
   sub-block j // 2, |lane| <= 4 * 62 * 127 < 2^15); vpackssdw of p = 0, 1 and of p = 2, 3 (word
   8 k + i of either: sub-block 2 k + (i % 4) // 2); vpdpwssd of both with the scales 2 ls + 1 in
   that word order.

The block sum is the portable kernel's integer `isum`, and the row's float steps are those of
`iq3.dot_iq3_xxs` in the same order, so the result is bit-identical to the portable kernels on the
GGUF bytes (four blocks at a time, with one transposed reduction and the float steps 4 wide, ran
at a third of the speed). `repack` and
`unpack` are lossless (the 8th sign bit of each 8 is the parity ksigns adds; `unpack` refuses
signs that break it).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.features import HAS_AVX512_VBMI
from strata.cpu.kernels.iq3 import avx512 as V
from strata.cpu.kernels.lut4 import _chunked
from strata.cpu.kernels.simd import I32, V8I32, Emit
from strata.cpu.kernels.tables import KSIGNS
from strata.cpu.quantize import pm_order

BB_GGUF, BB = 98, 102
SIGN_OFF, SCALE_OFF = 66, 98
# PERM[j]: the natural index of pm byte j of a super-block's x quants (pm_order's inverse)
PERM = np.argsort(pm_order.py_func(np.arange(256)))
MAG64 = np.array([V.LEVELS[i & 7] for i in range(64)], np.uint8)  # vpermb table
# the vpdpwssd multipliers: word 8 k + i gets the scale of sub-block 2 k + (i % 4) // 2
SC_SUB = np.array([2 * k + (i % 4) // 2 for k in range(4) for i in range(8)], np.int32)
_KS_BITS = ((KSIGNS[:, None] >> np.arange(8, dtype=np.uint8)) & 1).astype(np.uint8)  # [128, 8]


# ---------------------------------------------------------------- layout transform (NumPy)


@_chunked
def repack(w: np.ndarray) -> np.ndarray:
    """IQ3_XXS rows [R, nb * 98] (uint8) -> pm rows [R, nb * 102]."""
    if w.ndim != 2 or w.shape[1] % BB_GGUF:
        raise ValueError(f"rows of {BB_GGUF}-byte blocks expected, got shape {w.shape}")
    n = w.shape[0]
    bl = w.reshape(n, -1, BB_GGUF)
    nb = bl.shape[1]
    aux = bl[..., 66:98].copy().view("<u4")  # [n, nb, 8]
    field = (aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127  # [n, nb, 8, 4]
    sign = _KS_BITS[field].reshape(n, nb, 256)  # natural order
    pm = sign.reshape(n, nb, 64, 4).transpose(0, 1, 3, 2)  # [n, nb, p, g]
    ls = aux >> 28  # [n, nb, 8]
    out = np.empty((n, nb, BB), np.uint8)
    out[..., :66] = bl[..., :66]
    out[..., SIGN_OFF:SCALE_OFF] = np.packbits(pm, axis=-1, bitorder="little").reshape(n, nb, 32)
    scales = np.bitwise_or.reduce(ls << (4 * np.arange(8, dtype=np.uint32)), axis=-1)
    out[..., SCALE_OFF:] = scales.astype("<u4")[..., None].view(np.uint8)
    return out.reshape(n, nb * BB)


@_chunked
def unpack(p: np.ndarray) -> np.ndarray:
    """pm rows [R, nb * 102] -> the IQ3_XXS bytes they came from."""
    n = p.shape[0]
    bl = p.reshape(n, -1, BB)
    nb = bl.shape[1]
    bits = np.unpackbits(
        bl[..., SIGN_OFF:SCALE_OFF].reshape(n, nb, 4, 8), axis=-1, bitorder="little"
    )
    sign = bits.reshape(n, nb, 4, 64).transpose(0, 1, 3, 2).reshape(n, nb, 32, 8)  # natural
    field = (sign[..., :7].astype(np.uint32) << np.arange(7, dtype=np.uint32)).sum(-1)
    if np.any(KSIGNS[field] != np.packbits(sign, axis=-1, bitorder="little")[..., 0]):
        raise ValueError("pm sign bits break the IQ3_XXS parity rule (not a repacked block)")
    scales = bl[..., SCALE_OFF:].copy().view("<u4")[..., 0]  # [n, nb]
    ls = (scales[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 15  # [n, nb, 8]
    field = field.reshape(n, nb, 8, 4).astype(np.uint32)
    aux = (field << (7 * np.arange(4, dtype=np.uint32))).sum(-1, dtype=np.uint32) | (ls << 28)
    out = np.empty((n, nb, BB_GGUF), np.uint8)
    out[..., :66] = bl[..., :66]
    out[..., 66:] = aux.astype("<u4").view(np.uint8).reshape(n, nb, 32)
    return out.reshape(n, nb * BB_GGUF)


# ---------------------------------------------------------------- portable kernel (the oracle)


# ---------------------------------------------------------------- AVX-512 VBMI + VNNI


def _pm_scales(e: Emit, pw):
    """The vpdpwssd multipliers (`SC_SUB` order) from the block's scale word."""
    b = e.b
    s = e.bcast(e.load(pw, I32, SCALE_OFF), V8I32)
    ls = b.and_(b.lshr(s, e.const(V8I32, range(0, 32, 4))), e.splat(V8I32, 15))
    sc = b.or_(b.shl(ls, e.splat(V8I32, 1)), e.splat(V8I32, 1))  # word 2 s: 2 ls_s + 1
    sc = b.bitcast(sc, ir.VectorType(ir.IntType(16), 16))
    return b.bitcast(e.shuffle(sc, [2 * int(s) for s in SC_SUB]), V.V16I32)


def block_acc(e: Emit, pw, pxp):
    """The pm block sum as 16 int32 lanes still to be added, from i8* pw (the 102 block bytes)
    and pxp (its 256 x quants in position-major order)."""
    b = e.b
    g = e.load(pw, V.V64I8, 2)
    neg = b.icmp_signed("<", g, e.splat(V.V64I8, 0))
    la, lb = V._lut256(e, V.LUT_A, g, neg), V._lut256(e, V.LUT_B, g, neg)
    mag = e.const(V.V64I8, V._i8(MAG64))
    four = ir.Constant(V.V32I16, [4] * 32)
    zero8, zero = e.splat(V.V64I8, 0), e.splat(V.V16I32, 0)
    dots = []
    for p, lv in enumerate((la, None, lb, None)):
        if lv is None:  # levels 1 and 3: the high nibbles, moved down by a word shift
            src = la if p == 1 else lb
            lv = b.bitcast(b.lshr(b.bitcast(src, V.V32I16), four), V.V64I8)
        m = e._call("llvm.x86.avx512.permvar.qi.512", V.V64I8, [mag, lv])
        mask = b.bitcast(e.load(pw, ir.IntType(64), SIGN_OFF + 8 * p), V.V64I1)
        x = e.load(pxp, V.V64I8, 64 * p)
        xs = b.select(mask, b.sub(zero8, x), x)
        dots.append(
            e._call(
                "llvm.x86.avx512.vpdpbusd.512",
                V.V16I32,
                [zero, b.bitcast(m, V.V16I32), b.bitcast(xs, V.V16I32)],
            )
        )
    sc = _pm_scales(e, pw)
    acc = zero
    for h in range(2):
        pk = e._call("llvm.x86.avx512.packssdw.512", V.V32I16, dots[2 * h : 2 * h + 2])
        acc = e._call("llvm.x86.avx512.vpdpwssd.512", V.V16I32, [acc, b.bitcast(pk, V.V16I32), sc])
    return acc


def _xp_ptr(e: Emit, xfty, xf, a, xo):
    """i8* to byte xo of row a of the position-major quants (the bytes of xf's row a)."""
    row = e.ptr(xfty, xf, a, ir.Constant(ir.IntType(64), 0))
    return e.off(row, xo)


@intrinsic
def _blk_pm(typingctx, w, r, o, xf, a, xo):
    """The int32 sum of the pm block at w[r, o:o+102] against position-major quants at byte xo
    of xf's row a."""
    sig = types.int32(w, types.intp, types.intp, xf, types.intp, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        if not HAS_AVX512_VBMI:
            e.trap()
            return ir.Constant(I32, 0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        acc = block_acc(e, pw, _xp_ptr(e, sg.args[3], args[3], args[4], args[5]))
        return e._call("llvm.vector.reduce.add.v16i32", I32, [acc])

    return sig, codegen


@njit(cache=True)
def dot_pm_avx512(w, r, xq, xd, xb, x8, xf, a):
    """IQ3_XXS in the pm layout, AVX-512 VBMI + VNNI, on the position-major quants (xf's bytes,
    written by the Q8_K quantizer), a block at a time."""
    acc = np.float32(0.0)
    for b in range(w.shape[1] // BB):
        o = b * BB
        isum = _blk_pm(w, r, o, xf, a, 256 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.25)
    return acc
