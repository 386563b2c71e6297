"""IQ3_XXS repacked as 4-bit codes ("LUT4"): one vpshufb per 32 weights instead of grid lookups.

Every IQ3_XXS weight is one of 8 magnitudes (4, 12, ..., 62) with a sign, so it fits a nibble:
code = level index | sign << 3. A super-block of 256 weights becomes 134 bytes instead of 98
(1.37x), laid out per row as three planes so the 32-byte loads stay 16-byte aligned:

    [nb x 128: codes] [nb x 4: eight 4-bit sub-block scales] [nb x 2: f16 d]

Codes: byte i of 32-byte chunk j holds weight 64 j + i (low nibble) and 64 j + 32 + i (high
nibble), so sub-block 2 j is the low nibbles of chunk j and 2 j + 1 the high ones. The transform
is lossless (`unpack` rebuilds the GGUF bytes exactly: each grid entry and each 7-bit sign field
is recovered from the codes; the 8th sign is always the parity bit ksigns adds).

Kernel: the LUT holds level + 64 (2..126, so vpmaddubsw cannot saturate: 2 x 126 x 127 < 2**15);
sum((v + 64) x) - 64 sum(x) per sub-block, sum(x) from the Q8_K bsums.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.simd import HAS_AVX2, I32, V8I32, V16I16, V32I8, Emit
from strata.cpu.kernels.tables import IQ3XXS_GRID, IQ3XXS_LEVELS, KSIGNS

BB_GGUF, BB = 98, 134
_LEVELS = IQ3XXS_LEVELS.astype(np.int32)
# code -> signed weight, and the same + 64 for the SIMD path (unsigned operand of vpmaddubsw)
CODE_VALUE = np.concatenate([_LEVELS, -_LEVELS]).astype(np.int8)
_LUT_U8 = [int(v) + 64 for v in CODE_VALUE] * 2


# ---------------------------------------------------------------- layout transform (NumPy)


def repack(w: np.ndarray) -> np.ndarray:
    """IQ3_XXS rows [R, nb * 98] -> LUT4 rows [R, nb * 134]."""
    n = w.shape[0]
    bl = w.reshape(n, -1, BB_GGUF)
    nb = bl.shape[1]
    mag = IQ3XXS_GRID[bl[..., 2:66]].reshape(n, nb, 256)  # magnitudes 4..62
    level = np.searchsorted(IQ3XXS_LEVELS.astype(np.uint8), mag).astype(np.uint8)
    aux = bl[..., 66:98].copy().view(np.uint32)  # [n, nb, 8]
    sidx = (aux[..., None] >> (7 * np.arange(4, dtype=np.uint32))) & 127  # [n, nb, 8, 4]
    sbits = (KSIGNS[sidx][..., None] >> np.arange(8, dtype=np.uint8)) & 1  # [n, nb, 8, 4, 8]
    code = level | (sbits.reshape(n, nb, 256) << 3)
    c = code.reshape(n, nb, 4, 2, 32)  # chunk j, low/high half, byte i
    codes = (c[..., 0, :] | (c[..., 1, :] << 4)).reshape(n, nb * 128)
    ls = (aux >> 28).astype(np.uint32)  # [n, nb, 8]
    scales = np.bitwise_or.reduce(ls << (4 * np.arange(8, dtype=np.uint32)), axis=-1)
    out = np.empty((n, nb * BB), np.uint8)
    out[:, : 128 * nb] = codes
    out[:, 128 * nb : 132 * nb] = scales.astype("<u4").view(np.uint8).reshape(n, -1)
    out[:, 132 * nb :] = bl[..., 0:2].reshape(n, -1)
    return out


def _grid_index() -> np.ndarray:
    """Inverse of the grid: level indices (4 x 3 bits) -> grid entry."""
    lv = np.searchsorted(IQ3XXS_LEVELS.astype(np.uint8), IQ3XXS_GRID).astype(np.int64)
    key = lv[:, 0] | (lv[:, 1] << 3) | (lv[:, 2] << 6) | (lv[:, 3] << 9)
    inv = np.full(4096, -1, np.int64)
    inv[key] = np.arange(256)
    assert np.unique(key).size == 256  # the grid is injective: the repack is invertible
    return inv


def unpack(p: np.ndarray) -> np.ndarray:
    """LUT4 rows [R, nb * 134] -> the IQ3_XXS bytes they came from."""
    n = p.shape[0]
    nb = p.shape[1] // BB
    c = p[:, : 128 * nb].reshape(n, nb, 4, 1, 32)
    code = ((c >> np.array([0, 4], np.uint8)[:, None]) & 15).reshape(n, nb, 256)
    level = (code & 7).astype(np.int64).reshape(n, nb, 64, 4)
    key = level[..., 0] | (level[..., 1] << 3) | (level[..., 2] << 6) | (level[..., 3] << 9)
    idx = _grid_index()[key]
    if (idx < 0).any():
        raise ValueError("LUT4 codes name magnitudes that are not an IQ3_XXS grid entry")
    sign = (code >> 3).reshape(n, nb, 8, 4, 8).astype(np.uint32)
    field = np.bitwise_or.reduce(sign[..., :7] << np.arange(7, dtype=np.uint32), axis=-1)
    scales = p[:, 128 * nb : 132 * nb].copy().view("<u4").reshape(n, nb, 1)
    ls = (scales >> (4 * np.arange(8, dtype=np.uint32))) & 15  # [n, nb, 8]
    aux = np.bitwise_or.reduce(field << (7 * np.arange(4, dtype=np.uint32)), axis=-1) | (ls << 28)
    out = np.empty((n, nb, BB_GGUF), np.uint8)
    out[..., 0:2] = p[:, 132 * nb :].reshape(n, nb, 2)
    out[..., 2:66] = idx.astype(np.uint8)
    out[..., 66:98] = aux.astype("<u4").view(np.uint8).reshape(n, nb, 32)
    return out.reshape(n, nb * BB_GGUF)


# ---------------------------------------------------------------- kernels

_CV = CODE_VALUE


@njit(cache=True)
def dot_lut4_portable(w, r, xq, xd, xb, x8, xf, a):
    """The LUT4 layout in plain @njit (fallback and oracle of the SIMD kernel)."""
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        sc = np.uint32(w[r, 128 * nb + 4 * b]) | (np.uint32(w[r, 128 * nb + 4 * b + 1]) << 8)
        sc |= (np.uint32(w[r, 128 * nb + 4 * b + 2]) << 16) | (
            np.uint32(w[r, 128 * nb + 4 * b + 3]) << 24
        )
        isum = 0
        for j in range(4):
            t0 = 0
            t1 = 0
            for i in range(32):
                c = w[r, 128 * b + 32 * j + i]
                t0 += _CV[c & 15] * xq[a, 256 * b + 64 * j + i]
                t1 += _CV[c >> 4] * xq[a, 256 * b + 64 * j + 32 + i]
            isum += (2 * np.int32((sc >> (8 * j)) & 15) + 1) * t0
            isum += (2 * np.int32((sc >> (8 * j + 4)) & 15) + 1) * t1
        d = f16_at(w, r, 132 * nb + 2 * b)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.25)
    return acc


@intrinsic
def _blk_avx2(typingctx, w, r, qo, so, xq, a, xo, xb, bo):
    """sum_s (2 ls_s + 1) * sum_{i in s} v_i x_i over one super-block (int32)."""
    sig = types.int32(w, types.intp, types.intp, types.intp, xq, types.intp, types.intp, xb,
                      types.intp)

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
        s = e.bcast(e.load(ps, I32), V8I32)
        ls = b.and_(b.lshr(s, e.const(V8I32, range(0, 32, 4))), e.splat(V8I32, 15))
        sc = b.trunc(b.add(b.shl(ls, e.splat(V8I32, 1)), e.splat(V8I32, 1)),
                     ir.VectorType(ir.IntType(16), 8))
        sc = e.shuffle(sc, list(range(8)) * 2)  # both 128-bit lanes: splats become vpshufb
        lut = e.const(V32I8, _LUT_U8)
        acc = e.splat(V8I32, 0)
        for j in range(4):
            lo, hi = e.nibbles(e.load(pw, V32I8, 32 * j))
            pl = e.maddubs(e.pshufb(lut, lo), e.load(px, V32I8, 64 * j))
            ph = e.maddubs(e.pshufb(lut, hi), e.load(px, V32I8, 64 * j + 32))
            acc = b.add(acc, e.madd(pl, e.shuffle(sc, [2 * j] * 8 + [8 + 2 * j] * 8)))
            acc = b.add(acc, e.madd(ph, e.shuffle(sc, [2 * j + 1] * 8 + [9 + 2 * j] * 8)))
        # the +64 offset: 64 * sum_s sc_s * (bsum[2s] + bsum[2s+1])
        corr = e.madd(e.load(pb, V16I16), e.shuffle(sc, [k // 2 for k in range(8)] + [8 + 4 + k // 2 for k in range(8)]))
        acc = b.sub(acc, b.shl(corr, e.splat(V8I32, 6)))
        return e.hsum(acc)

    return sig, codegen


@njit(cache=True)
def dot_lut4_avx2(w, r, xq, xd, xb, x8, xf, a):
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        isum = _blk_avx2(w, r, 128 * b, 128 * nb + 4 * b, xq, a, 256 * b, xb, 16 * b)
        d = f16_at(w, r, 132 * nb + 2 * b)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.25)
    return acc
