"""IQ2_S repacked as 4-bit codes (its "lut4" layout): one vpshufb per 32 weights, no grid reads.

Every IQ2_S weight is one of three magnitudes (8, 25, 43) with a sign, so it fits a nibble:
code = level index | sign << 3, as in lut4.py. IQ2_S keeps a scale per 16 weights (16 a
super-block, where the lut4.py formats have 8), so its rows carry its 8 scale bytes as they are:

    [nb x 128: codes] [nb x 8: the sixteen 4-bit scales, GGUF bytes] [nb x 2: f16 d]

138 bytes a super-block against the GGUF's 82 (1.68x). Codes are arranged as lut4.py's: byte i
of 32-byte chunk j holds weight 64 j + i (low nibble) and 64 j + 32 + i (high nibble). The
transform is lossless: `unpack` recovers each 10-bit grid index from its 8 levels (the grid's
1024 rows are distinct level patterns) and each sign byte from its 8 bits.

Why: an AVX2 kernel on the GGUF bytes reads a grid row from an 8 KB table per 8 weights by
scalar loads, and inserts them into vectors; one core computes 10.8 Gweights/s so, against this
kernel's 37.6 (weights in L2).
Here the weight values come from a 16-entry vpshufb table, as in lut4.py: LUT entry level + 64
(u8, 72..107), sum((v + 64) x) - 64 sum(x) per 16 weights, sum(x) from the Q8_K bsums, which are
per 16 weights too. vpmaddwd takes each chunk's two scales as one row of a 256-row table indexed
by the scale byte.

Plain twin (and the fallback): `dot_iq2s_lut4_portable`. Both give the GGUF kernels' bits: the
same integer sums, the same float steps (`iq2.dot_iq2_s`).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.iq2.portable import S_BB
from strata.cpu.kernels.lut4 import _chunked
from strata.cpu.kernels.simd import I8, I16, I32, I64, V8I32, V16I16, V32I8, Emit, const_table
from strata.cpu.kernels.tables import IQ2S_GRID

BB = 138  # repacked bytes per super-block of 256 weights
LEVELS = np.unique(IQ2S_GRID).astype(np.int8)  # 8, 25, 43
assert LEVELS.size == 3
# code -> signed weight (codes 3..7 and 11..15 unused: 0)
CODE_VALUES = np.concatenate([np.pad(LEVELS, (0, 5)), -np.pad(LEVELS, (0, 5))]).astype(np.int8)
_LEVEL = np.searchsorted(LEVELS.astype(np.uint8), IQ2S_GRID).astype(np.uint8)  # [1024, 8]
_GKEY = (_LEVEL.astype(np.int64) << (2 * np.arange(8))).sum(axis=-1)  # 8 levels -> 16 bits
assert np.unique(_GKEY).size == _GKEY.size  # injective: the repack is invertible
_INV = np.full(1 << 16, -1, np.int64)
_INV[_GKEY] = np.arange(_GKEY.size)
# vpmaddwd multiplier of a chunk half per scale byte k: 2 (k & 15) + 1 in lanes 0..7 (weights
# 0..15 of the 32), 2 (k >> 4) + 1 in lanes 8..15
_SC_BYTE = [2 * ((k >> (4 * (i // 8))) & 15) + 1 for k in range(256) for i in range(16)]
_LUT = [int(v) + 64 for v in CODE_VALUES] * 2
_V8I8 = ir.VectorType(I8, 8)


# ---------------------------------------------------------------- layout transform


@njit(cache=True, parallel=True)
def _repack_rows(w, out, level_of):
    nb = w.shape[1] // S_BB
    for r in prange(w.shape[0]):
        for b in range(nb):
            o = b * S_BB
            out[r, 136 * nb + 2 * b] = w[r, o]
            out[r, 136 * nb + 2 * b + 1] = w[r, o + 1]
            for i in range(8):
                out[r, 128 * nb + 8 * b + i] = w[r, o + 74 + i]
            for i in range(128):
                out[r, 128 * b + i] = 0
            for k in range(32):  # grid index k: weights 8k..8k+7
                idx = np.int32(w[r, o + 2 + k]) | (
                    ((np.int32(w[r, o + 66 + k // 4]) >> (2 * (k & 3))) & 3) << 8
                )
                sb = w[r, o + 34 + k]
                for e in range(8):
                    i = 8 * k + e
                    code = level_of[idx, e] | (((sb >> e) & 1) << 3)
                    j, m = i // 64, i % 64
                    if m < 32:
                        out[r, 128 * b + 32 * j + m] |= code
                    else:
                        out[r, 128 * b + 32 * j + m - 32] |= code << 4


def repack(w: np.ndarray) -> np.ndarray:
    """IQ2_S rows [R, nb * 82] -> lut4 rows [R, nb * 138] (Numba, parallel over rows)."""
    w = np.ascontiguousarray(w).view(np.uint8)
    out = np.empty((w.shape[0], w.shape[1] // S_BB * BB), np.uint8)
    _repack_rows(w, out, _LEVEL)
    return out


def _gguf_fields(bl: np.ndarray):
    """(grid indices [n, nb, 32], sign bytes [n, nb, 32]) of IQ2_S blocks [n, nb, 82]."""
    n, nb = bl.shape[:2]
    hi = ((bl[..., 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3).reshape(n, nb, 32)
    return bl[..., 2:34].astype(np.int64) | (hi.astype(np.int64) << 8), bl[..., 34:66]


@_chunked
def repack_reference(w: np.ndarray) -> np.ndarray:
    """IQ2_S rows [R, nb * 82] -> lut4 rows [R, nb * 138]: the NumPy statement of `repack`."""
    n = w.shape[0]
    bl = w.reshape(n, -1, S_BB)
    nb = bl.shape[1]
    idx, sb = _gguf_fields(bl)
    level = _LEVEL[idx].reshape(n, nb, 256)
    sign = ((sb[..., None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(n, nb, 256)
    c = (level | (sign << 3)).reshape(n, nb, 4, 2, 32)  # chunk j, low/high half, byte i
    out = np.empty((n, nb * BB), np.uint8)
    out[:, : 128 * nb] = (c[..., 0, :] | (c[..., 1, :] << 4)).reshape(n, nb * 128)
    out[:, 128 * nb : 136 * nb] = bl[..., 74:82].reshape(n, nb * 8)
    out[:, 136 * nb :] = bl[..., 0:2].reshape(n, nb * 2)
    return out


@_chunked
def unpack(p: np.ndarray) -> np.ndarray:
    """lut4 rows [R, nb * 138] -> the IQ2_S bytes they came from."""
    n = p.shape[0]
    nb = p.shape[1] // BB
    c = p[:, : 128 * nb].reshape(n, nb, 4, 1, 32)
    code = ((c >> np.array([0, 4], np.uint8)[:, None]) & 15).reshape(n, nb, 32, 8)
    lv = (code & 7).astype(np.int64)
    if (lv > 2).any():
        raise ValueError("lut4 codes name a level IQ2_S does not have")
    idx = _INV[(lv << (2 * np.arange(8))).sum(axis=-1)]  # [n, nb, 32]
    if (idx < 0).any():
        raise ValueError("lut4 codes name magnitudes that are not an IQ2_S grid entry")
    out = np.empty((n, nb, S_BB), np.uint8)
    out[..., 0:2] = p[:, 136 * nb :].reshape(n, nb, 2)
    out[..., 2:34] = (idx & 255).astype(np.uint8)
    sign = (code >> 3).astype(np.uint8)
    out[..., 34:66] = np.bitwise_or.reduce(sign << np.arange(8, dtype=np.uint8), axis=-1)
    hi = ((idx >> 8) & 3).astype(np.uint8).reshape(n, nb, 8, 4)
    out[..., 66:74] = np.bitwise_or.reduce(hi << np.array([0, 2, 4, 6], np.uint8), axis=-1)
    out[..., 74:82] = p[:, 128 * nb : 136 * nb].reshape(n, nb, 8)
    return out.reshape(n, nb * S_BB)


# ---------------------------------------------------------------- kernels


@intrinsic
def _blk_avx2(typingctx, w, r, qo, so, xq, a, xo, xb, bo):
    """sum_h (2 ls_h + 1) sum_{i in h} v_i x_i over one super-block (int32; h: 16 weights)."""
    ip = types.intp
    sig = types.int32(w, ip, ip, ip, xq, ip, ip, xb, ip)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(I32, 0)
        b = builder
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        ps = e.ptr(sg.args[0], args[0], args[1], args[3])
        px = e.ptr(sg.args[4], args[4], args[5], args[6])
        pb = e.ptr(sg.args[7], args[7], args[5], args[8])
        sct = const_table(e, "strata_iq2s_sc_byte_i16", I16, _SC_BYTE)
        sct = b.bitcast(sct, V16I16.as_pointer())
        lut = e.const(V32I8, _LUT)
        acc = e.splat(V8I32, 0)
        for j in range(4):
            lo, hi = e.nibbles(e.load(pw, V32I8, 32 * j))
            for k, nib in enumerate((lo, hi)):
                p = e.maddubs(e.pshufb(lut, nib), e.load(px, V32I8, 64 * j + 32 * k))
                key = b.zext(e.load(ps, I8, 2 * j + k), I64)
                acc = b.add(acc, e.madd(p, b.load(b.gep(sct, [key]), align=32)))
        # the +64 offset: 64 sum_h (2 ls_h + 1) bsum_h
        s8 = e.load(ps, _V8I8)
        m = e.splat(_V8I8, 15)
        nib = b.shuffle_vector(
            b.and_(s8, m),
            b.lshr(s8, e.splat(_V8I8, 4)),
            ir.Constant(ir.VectorType(I32, 16), [h // 2 + 8 * (h & 1) for h in range(16)]),
        )
        sc = b.add(b.shl(b.zext(nib, V16I16), e.splat(V16I16, 1)), e.splat(V16I16, 1))
        corr = e.madd(e.load(pb, V16I16), sc)
        acc = b.sub(acc, b.shl(corr, e.splat(V8I32, 6)))
        return e.hsum(acc)

    return sig, codegen


@njit(cache=True)
def dot_iq2s_lut4_avx2(w, r, xq, xd, xb, x8, xf, a):
    """IQ2_S in its lut4 layout, AVX2."""
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        isum = _blk_avx2(w, r, 128 * b, 128 * nb + 8 * b, xq, a, 256 * b, xb, 16 * b)
        d = f16_at(w, r, 136 * nb + 2 * b)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.125)
    return acc
