"""IQ3_XXS, IQ3_S and IQ2_XXS repacked as 4-bit codes ("LUT4"): one vpshufb per 32 weights.

Every IQ3_XXS weight is one of 8 magnitudes (4, 12, ..., 62) with a sign, every IQ3_S weight one
of (1, 3, ..., 15), every IQ2_XXS weight one of (8, 25, 43), so each fits a nibble: code =
level index | sign << 3. A super-block of 256 weights becomes 134 bytes instead of 98 (IQ3_XXS,
1.37x), 110 (IQ3_S, 1.22x) or 66 (IQ2_XXS, 2.03x: still far faster than decoding its grid),
laid out per row as three planes so the 32-byte loads stay 16-byte aligned:

    [nb x 128: codes] [nb x 4: eight 4-bit sub-block scales] [nb x 2: f16 d]

Codes: byte i of 32-byte chunk j holds weight 64 j + i (low nibble) and 64 j + 32 + i (high
nibble), so sub-block 2 j is the low nibbles of chunk j and 2 j + 1 the high ones. The transform
is lossless (`unpack` rebuilds the GGUF bytes exactly: each grid entry and each 7-bit sign field
is recovered from the codes; the 8th sign of IQ3_XXS/IQ2_XXS is always the parity bit ksigns
adds). All three scale sub-block s by (2 ls_s + 1), times d / 4 (IQ3_XXS), d (IQ3_S) or d / 8
(IQ2_XXS).

Kernel: the LUT holds level + 64 (2..126, so vpmaddubsw cannot saturate: 2 x 126 x 127 < 2**15);
sum((v + 64) x) - 64 sum(x) per sub-block, sum(x) from the Q8_K bsums.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.simd import I32, V8I32, V16I16, V32I8, Emit
from strata.cpu.kernels.tables import IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, IQ3XXS_LEVELS, KSIGNS

BB_GGUF, BB_GGUF_S, BB_GGUF_2XXS, BB = 98, 110, 66, 134
IQ3S_LEVELS = np.unique(IQ3S_GRID).astype(np.int8)  # 1, 3, ..., 15
IQ2XXS_LEVELS = np.unique(IQ2XXS_GRID).astype(np.int8)  # 8, 25, 43
assert IQ3S_LEVELS.size == 8 and IQ2XXS_LEVELS.size == 3
# code -> signed weight, per variant (0: IQ3_XXS, 1: IQ3_S, 2: IQ2_XXS; unused codes 0);
# + 64 for vpmaddubsw's u8 operand
CODE_VALUES = np.stack(
    [
        np.concatenate([lv, -lv]).astype(np.int8)
        for lv in (
            IQ3XXS_LEVELS.astype(np.int32),
            IQ3S_LEVELS.astype(np.int32),
            np.pad(IQ2XXS_LEVELS.astype(np.int32), (0, 5)),
        )
    ]
)
CODE_VALUE = CODE_VALUES[0]
FACTOR = (0.25, 1.0, 0.125)  # d * (2 ls + 1) * FACTOR scales a sub-block


# ---------------------------------------------------------------- layout transform (NumPy)


# lookup tables for the repack: grid entry -> level indices, ksigns index -> 8 sign bits
_XXS_LEVEL = np.searchsorted(IQ3XXS_LEVELS.astype(np.uint8), IQ3XXS_GRID).astype(np.uint8)
_S_LEVEL = ((IQ3S_GRID.astype(np.int64) - 1) // 2).astype(np.uint8)
_2XXS_LEVEL = np.searchsorted(IQ2XXS_LEVELS.astype(np.uint8), IQ2XXS_GRID).astype(np.uint8)
_KS_BITS = ((KSIGNS[:, None] >> np.arange(8, dtype=np.uint8)) & 1).astype(np.uint8)  # [128, 8]
_CHUNK_ROWS = 2048  # repack this many rows at a time: the temporaries stay in cache-sized bites


def _chunked(fn):
    """Apply a row-wise repack/unpack to row chunks (bounded temporaries on whole tensors)."""

    def run(w: np.ndarray) -> np.ndarray:
        if w.shape[0] <= _CHUNK_ROWS:
            return fn(w)
        first = fn(w[:_CHUNK_ROWS])
        out = np.empty((w.shape[0], first.shape[1]), np.uint8)
        out[:_CHUNK_ROWS] = first
        for r in range(_CHUNK_ROWS, w.shape[0], _CHUNK_ROWS):
            out[r : r + _CHUNK_ROWS] = fn(w[r : r + _CHUNK_ROWS])
        return out

    run.__doc__ = fn.__doc__
    run.__name__ = fn.__name__
    return run


def _pack(level, sbits, scales, d) -> np.ndarray:
    """LUT4 rows from levels and sign bits [n, nb, 256], scale words [n, nb], d bytes [n, nb, 2]."""
    n, nb = level.shape[:2]
    code = level.astype(np.uint8) | (sbits.astype(np.uint8) << 3)
    c = code.reshape(n, nb, 4, 2, 32)  # chunk j, low/high half, byte i
    out = np.empty((n, nb * BB), np.uint8)
    out[:, : 128 * nb] = (c[..., 0, :] | (c[..., 1, :] << 4)).reshape(n, nb * 128)
    out[:, 128 * nb : 132 * nb] = scales.astype("<u4").view(np.uint8).reshape(n, -1)
    out[:, 132 * nb :] = d.reshape(n, -1)
    return out


def _codes(p: np.ndarray):
    """(level [n, nb, 256], sign bits [n, nb, 256], scale words [n, nb], d bytes [n, nb, 2])."""
    n = p.shape[0]
    nb = p.shape[1] // BB
    c = p[:, : 128 * nb].reshape(n, nb, 4, 1, 32)
    code = ((c >> np.array([0, 4], np.uint8)[:, None]) & 15).reshape(n, nb, 256)
    scales = p[:, 128 * nb : 132 * nb].copy().view("<u4").reshape(n, nb)
    return code & 7, code >> 3, scales, p[:, 132 * nb :].reshape(n, nb, 2)


def repack(w: np.ndarray) -> np.ndarray:
    """IQ3_XXS rows [R, nb * 98] -> LUT4 rows [R, nb * 134] (Numba, parallel over rows)."""
    return _numba_repack(_repack_xxs_rows, BB_GGUF, _XXS_LEVEL, _KS_BITS)(w)


def repack_s(w: np.ndarray) -> np.ndarray:
    """IQ3_S rows [R, nb * 110] -> LUT4 rows [R, nb * 134] (Numba, parallel over rows)."""
    return _numba_repack(_repack_s_rows, BB_GGUF_S, _S_LEVEL)(w)


def repack_2xxs(w: np.ndarray) -> np.ndarray:
    """IQ2_XXS rows [R, nb * 66] -> LUT4 rows [R, nb * 134] (Numba, parallel over rows)."""
    return _numba_repack(_repack_2xxs_rows, BB_GGUF_2XXS, _2XXS_LEVEL, _KS_BITS)(w)


@njit(cache=True, inline="always")
def _put(out, r, b, i, code):
    """Code of weight i of block b into row r of LUT4 rows (low nibble: first half of a chunk)."""
    j, m = i // 64, i % 64
    if m < 32:
        out[r, 128 * b + 32 * j + m] |= code
    else:
        out[r, 128 * b + 32 * j + m - 32] |= code << 4


@njit(cache=True, inline="always")
def _start_block(out, r, b, nb, d0, d1):
    out[r, 132 * nb + 2 * b] = d0
    out[r, 132 * nb + 2 * b + 1] = d1
    for i in range(128):
        out[r, 128 * b + i] = 0


@njit(cache=True, inline="always")
def _put_scales(out, r, b, nb, words):
    for k in range(4):
        out[r, 128 * nb + 4 * b + k] = (words >> (8 * k)) & 255


@njit(cache=True, inline="always")
def _u32(w, r, q):
    return (
        np.uint32(w[r, q])
        | (np.uint32(w[r, q + 1]) << 8)
        | (np.uint32(w[r, q + 2]) << 16)
        | (np.uint32(w[r, q + 3]) << 24)
    )


@njit(cache=True, parallel=True)
def _repack_xxs_rows(w, out, level_of, sign_bits):
    nb = w.shape[1] // BB_GGUF
    for r in prange(w.shape[0]):
        for b in range(nb):
            o = b * BB_GGUF
            _start_block(out, r, b, nb, w[r, o], w[r, o + 1])
            words = np.uint32(0)
            for s in range(8):
                aux = _u32(w, r, o + 66 + 4 * s)
                words |= (aux >> 28) << (4 * s)
                for g in range(4):
                    sidx = (aux >> (7 * g)) & 127
                    for h in range(2):
                        idx = w[r, o + 2 + 8 * s + 2 * g + h]
                        for k in range(4):
                            code = level_of[idx, k] | (sign_bits[sidx, 4 * h + k] << 3)
                            _put(out, r, b, 32 * s + 8 * g + 4 * h + k, code)
            _put_scales(out, r, b, nb, words)


@njit(cache=True, parallel=True)
def _repack_s_rows(w, out, level_of):
    nb = w.shape[1] // BB_GGUF_S
    for r in prange(w.shape[0]):
        for b in range(nb):
            o = b * BB_GGUF_S
            _start_block(out, r, b, nb, w[r, o], w[r, o + 1])
            for k in range(64):  # grid index k: weights 4k..4k+3
                idx = np.int32(w[r, o + 2 + k]) | (
                    ((np.int32(w[r, o + 66 + k // 8]) >> (k % 8)) & 1) << 8
                )
                for e in range(4):
                    i = 4 * k + e
                    sign = (w[r, o + 74 + i // 8] >> (i % 8)) & 1
                    _put(out, r, b, i, level_of[idx, e] | (sign << 3))
            _put_scales(out, r, b, nb, _u32(w, r, o + 106))  # nibble s is already ls_s


@njit(cache=True, parallel=True)
def _repack_2xxs_rows(w, out, level_of, sign_bits):
    nb = w.shape[1] // BB_GGUF_2XXS
    for r in prange(w.shape[0]):
        for b in range(nb):
            o = b * BB_GGUF_2XXS
            _start_block(out, r, b, nb, w[r, o], w[r, o + 1])
            words = np.uint32(0)
            for s in range(8):
                aux = _u32(w, r, o + 2 + 8 * s + 4)
                words |= (aux >> 28) << (4 * s)
                for g in range(4):
                    idx = w[r, o + 2 + 8 * s + g]
                    sidx = (aux >> (7 * g)) & 127
                    for e in range(8):
                        code = level_of[idx, e] | (sign_bits[sidx, e] << 3)
                        _put(out, r, b, 32 * s + 8 * g + e, code)
            _put_scales(out, r, b, nb, words)


def _numba_repack(rows_fn, bb, *tables):
    def run(w: np.ndarray) -> np.ndarray:
        w = np.ascontiguousarray(w).view(np.uint8)
        out = np.empty((w.shape[0], w.shape[1] // bb * BB), np.uint8)
        rows_fn(w, out, *tables)
        return out

    return run


@_chunked
def repack_reference(w: np.ndarray) -> np.ndarray:
    """IQ3_XXS rows [R, nb * 98] -> LUT4 rows [R, nb * 134]: the NumPy statement of `repack`."""
    n = w.shape[0]
    bl = w.reshape(n, -1, BB_GGUF)
    nb = bl.shape[1]
    level = _XXS_LEVEL[bl[..., 2:66]].reshape(n, nb, 256)
    aux = bl[..., 66:98].copy().view(np.uint32)  # [n, nb, 8]
    sidx = (aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127  # [n, nb, 8, 4]
    sbits = _KS_BITS[sidx].reshape(n, nb, 256)
    ls = (aux >> 28).astype(np.uint32)  # [n, nb, 8]
    scales = np.bitwise_or.reduce(ls << (4 * np.arange(8, dtype=np.uint32)), axis=-1)
    return _pack(level, sbits, scales, bl[..., 0:2])


@_chunked
def repack_2xxs_reference(w: np.ndarray) -> np.ndarray:
    """IQ2_XXS rows [R, nb * 66] -> LUT4 rows [R, nb * 134]: NumPy statement of `repack_2xxs`."""
    n = w.shape[0]
    bl = w.reshape(n, -1, BB_GGUF_2XXS)
    nb = bl.shape[1]
    words = bl[..., 2:].copy().view(np.uint32).reshape(n, nb, 8, 2)
    idx = words[..., 0:1].copy().view(np.uint8)  # [n, nb, 8, 4] grid indices
    level = _2XXS_LEVEL[idx].reshape(n, nb, 256)
    aux = words[..., 1]  # [n, nb, 8]: 4 x 7 sign bits + 4-bit scale
    sidx = (aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127
    sbits = _KS_BITS[sidx].reshape(n, nb, 256)
    ls = (aux >> 28).astype(np.uint32)
    scales = np.bitwise_or.reduce(ls << (4 * np.arange(8, dtype=np.uint32)), axis=-1)
    return _pack(level, sbits, scales, bl[..., 0:2])


@_chunked
def repack_s_reference(w: np.ndarray) -> np.ndarray:
    """IQ3_S rows [R, nb * 110] -> LUT4 rows [R, nb * 134]: NumPy statement of `repack_s`."""
    n = w.shape[0]
    bl = w.reshape(n, -1, BB_GGUF_S)
    nb = bl.shape[1]
    hi = ((bl[..., 66:74, None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(n, nb, 64)
    idx = bl[..., 2:66].astype(np.int64) | (hi.astype(np.int64) << 8)
    level = _S_LEVEL[idx].reshape(n, nb, 256)
    sbits = ((bl[..., 74:106, None] >> np.arange(8, dtype=np.uint8)) & 1).reshape(n, nb, 256)
    scales = bl[..., 106:110].copy().view("<u4")[..., 0]  # nibble s = ls of sub-block s already
    return _pack(level, sbits, scales, bl[..., 0:2])


def _grid_index(grid: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Inverse of a 4-wide grid: level indices (4 x 3 bits) -> grid entry (-1: none)."""
    lv = np.searchsorted(levels.astype(np.uint8), grid).astype(np.int64)
    key = lv[:, 0] | (lv[:, 1] << 3) | (lv[:, 2] << 6) | (lv[:, 3] << 9)
    inv = np.full(4096, -1, np.int64)
    inv[key] = np.arange(grid.shape[0])
    assert np.unique(key).size == grid.shape[0]  # injective: the repack is invertible
    return inv


@_chunked
def unpack(p: np.ndarray) -> np.ndarray:
    """LUT4 rows [R, nb * 134] -> the IQ3_XXS bytes they came from."""
    level, sign, scales, d = _codes(p)
    n, nb = level.shape[:2]
    lv = level.astype(np.int64).reshape(n, nb, 64, 4)
    key = lv[..., 0] | (lv[..., 1] << 3) | (lv[..., 2] << 6) | (lv[..., 3] << 9)
    idx = _grid_index(IQ3XXS_GRID, IQ3XXS_LEVELS)[key]
    if (idx < 0).any():
        raise ValueError("LUT4 codes name magnitudes that are not an IQ3_XXS grid entry")
    field = _sign_fields(sign, n, nb)
    ls = (scales[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 15  # [n, nb, 8]
    aux = np.bitwise_or.reduce(field << (7 * np.arange(4, dtype=np.uint32)), axis=-1) | (ls << 28)
    out = np.empty((n, nb, BB_GGUF), np.uint8)
    out[..., 0:2] = d
    out[..., 2:66] = idx.astype(np.uint8)
    out[..., 66:98] = aux.astype("<u4").view(np.uint8).reshape(n, nb, 32)
    return out.reshape(n, nb * BB_GGUF)


def _sign_fields(sign: np.ndarray, n: int, nb: int) -> np.ndarray:
    """Sign bits [n, nb, 256] -> the 7-bit ksigns fields [n, nb, 8, 4] (8th bit is parity)."""
    sign = sign.reshape(n, nb, 8, 4, 8).astype(np.uint32)
    return np.bitwise_or.reduce(sign[..., :7] << np.arange(7, dtype=np.uint32), axis=-1)


@_chunked
def unpack_2xxs(p: np.ndarray) -> np.ndarray:
    """LUT4 rows [R, nb * 134] -> the IQ2_XXS bytes they came from."""
    level, sign, scales, d = _codes(p)
    n, nb = level.shape[:2]
    lv = level.astype(np.int64).reshape(n, nb, 32, 8)
    key = (lv << (2 * np.arange(8))).sum(axis=-1)
    grid_lv = np.searchsorted(IQ2XXS_LEVELS.astype(np.uint8), IQ2XXS_GRID).astype(np.int64)
    gkey = (grid_lv << (2 * np.arange(8))).sum(axis=-1)
    assert np.unique(gkey).size == gkey.size  # injective: the repack is invertible
    inv = np.full(1 << 16, -1, np.int64)
    inv[gkey] = np.arange(gkey.size)
    idx = inv[key]
    if (idx < 0).any():
        raise ValueError("LUT4 codes name magnitudes that are not an IQ2_XXS grid entry")
    field = _sign_fields(sign, n, nb)
    ls = (scales[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 15  # [n, nb, 8]
    aux = np.bitwise_or.reduce(field << (7 * np.arange(4, dtype=np.uint32)), axis=-1) | (ls << 28)
    words = np.empty((n, nb, 8, 2), np.uint32)
    words[..., 0] = idx.astype(np.uint8).reshape(n, nb, 8, 4).copy().view("<u4")[..., 0]
    words[..., 1] = aux
    out = np.empty((n, nb, BB_GGUF_2XXS), np.uint8)
    out[..., 0:2] = d
    out[..., 2:] = words.astype("<u4").view(np.uint8).reshape(n, nb, 64)
    return out.reshape(n, nb * BB_GGUF_2XXS)


@_chunked
def unpack_s(p: np.ndarray) -> np.ndarray:
    """LUT4 rows [R, nb * 134] -> the IQ3_S bytes they came from."""
    level, sign, scales, d = _codes(p)
    n, nb = level.shape[:2]
    lv = level.astype(np.int64).reshape(n, nb, 64, 4)
    key = lv[..., 0] | (lv[..., 1] << 3) | (lv[..., 2] << 6) | (lv[..., 3] << 9)
    idx = _grid_index(IQ3S_GRID, IQ3S_LEVELS)[key]
    if (idx < 0).any():
        raise ValueError("LUT4 codes name magnitudes that are not an IQ3_S grid entry")
    out = np.empty((n, nb, BB_GGUF_S), np.uint8)
    out[..., 0:2] = d
    out[..., 2:66] = (idx & 255).astype(np.uint8)
    hi = ((idx >> 8) & 1).astype(np.uint8).reshape(n, nb, 8, 8)
    out[..., 66:74] = np.bitwise_or.reduce(hi << np.arange(8, dtype=np.uint8), axis=-1)
    sb = sign.astype(np.uint8).reshape(n, nb, 32, 8)
    out[..., 74:106] = np.bitwise_or.reduce(sb << np.arange(8, dtype=np.uint8), axis=-1)
    out[..., 106:110] = scales.astype("<u4").view(np.uint8).reshape(n, nb, 4)
    return out.reshape(n, nb * BB_GGUF_S)


# ---------------------------------------------------------------- kernels


_CV_XXS, _CV_S, _CV_2XXS = (CODE_VALUES[k].copy() for k in range(3))


@intrinsic(prefer_literal=True)
def _blk_avx2(typingctx, w, r, qo, so, xq, a, xo, xb, bo, variant):
    """sum_s (2 ls_s + 1) * sum_{i in s} v_i x_i over one super-block (int32); `variant` (a
    literal) picks the LUT: 0 IQ3_XXS, 1 IQ3_S, 2 IQ2_XXS."""
    if not isinstance(variant, types.IntegerLiteral):
        return None
    lut_values = [int(v) + 64 for v in CODE_VALUES[variant.literal_value]] * 2
    sig = types.int32(
        w, types.intp, types.intp, types.intp, xq, types.intp, types.intp, xb, types.intp, variant
    )

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
        # in each 128-bit lane, int32 i holds the int16 pair (sc_i, sc_i+4), sc = 2 ls + 1: every
        # splat below is one in-lane vpshufb of these bytes
        s = e.bcast(e.load(ps, I32), V8I32)
        ls = b.and_(b.lshr(s, e.const(V8I32, [0, 4, 8, 12] * 2)), e.splat(V8I32, 0x000F000F))
        sc = b.bitcast(b.add(b.shl(ls, e.splat(V8I32, 1)), e.splat(V8I32, 0x00010001)), V32I8)

        def splat(ctl):  # int16 words: sub-block k's scale is bytes 4 (k % 4) + 2 (k // 4), + 1
            return b.bitcast(e.pshufb(sc, e.const(V32I8, ctl)), V16I16)

        def word(k):
            return [4 * (k % 4) + 2 * (k // 4), 4 * (k % 4) + 2 * (k // 4) + 1]

        lut = e.const(V32I8, lut_values)
        acc = e.splat(V8I32, 0)
        for j in range(4):
            lo, hi = e.nibbles(e.load(pw, V32I8, 32 * j))
            pl = e.maddubs(e.pshufb(lut, lo), e.load(px, V32I8, 64 * j))
            ph = e.maddubs(e.pshufb(lut, hi), e.load(px, V32I8, 64 * j + 32))
            acc = b.add(acc, e.madd(pl, splat(word(2 * j) * 16)))
            acc = b.add(acc, e.madd(ph, splat(word(2 * j + 1) * 16)))
        # the +64 offset: 64 * sum_s sc_s * (bsum[2s] + bsum[2s+1]), scales 0..3 low, 4..7 high
        pairs = [c for k in range(8) for c in word(k // 2)]
        pairs += [c for k in range(8) for c in word(4 + k // 2)]
        corr = e.madd(e.load(pb, V16I16), splat(pairs))
        acc = b.sub(acc, b.shl(corr, e.splat(V8I32, 6)))
        return e.hsum(acc)

    return sig, codegen


@njit(cache=True)
def dot_lut4_avx2(w, r, xq, xd, xb, x8, xf, a):
    """IQ3_XXS in the LUT4 layout, AVX2."""
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        isum = _blk_avx2(w, r, 128 * b, 128 * nb + 4 * b, xq, a, 256 * b, xb, 16 * b, 0)
        d = f16_at(w, r, 132 * nb + 2 * b)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.25)
    return acc


@njit(cache=True)
def dot_lut4_s_avx2(w, r, xq, xd, xb, x8, xf, a):
    """IQ3_S in the LUT4 layout, AVX2."""
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        isum = _blk_avx2(w, r, 128 * b, 128 * nb + 4 * b, xq, a, 256 * b, xb, 16 * b, 1)
        d = f16_at(w, r, 132 * nb + 2 * b)
        acc += np.float32(xd[a, b] * d) * np.float32(isum)
    return acc


@njit(cache=True)
def dot_lut4_2xxs_avx2(w, r, xq, xd, xb, x8, xf, a):
    """IQ2_XXS in the LUT4 layout, AVX2."""
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        isum = _blk_avx2(w, r, 128 * b, 128 * nb + 4 * b, xq, a, 256 * b, xb, 16 * b, 2)
        d = f16_at(w, r, 132 * nb + 2 * b)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.125)
    return acc
