"""IQ1_M repacked as 2-bit ternary codes ("T2"): shifts and masks instead of 11-bit grid lookups.

IQ1_M weights are g + delta with g in {-1, 0, 1} from a 2048-entry grid; storing u = g + 1 in
2 bits costs 64 bytes per 256 weights instead of the 48 bytes of indices. A super-block becomes
76 bytes instead of 56 (1.36x), laid out per row as three planes:

    [nb x 64: codes] [nb x 4: delta sign bits, bit k = group k of 8] [nb x 8: scale words]

Codes: byte i of 32-byte chunk c, bits 2k..2k+1, hold weight 128 c + 32 k + i. The scale words
are IQ1_M's own 8 bytes (3-bit scales and the f16 d in the top nibbles), copied. Lossless:
`unpack` recovers every 11-bit index from the 8 ternary values (the iq1s grid is injective).

Kernel (integers times 8, as in `iq1.dot_iq1_m`): per 16 weights with scale sc = 2 ls + 1,
8 sc sum(u x) + sum over its two groups of sc (delta_g - 8) X8_g, X8 = sums of 8 activation
quants; delta_g = +-1.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.iq1.portable import iq1m_d
from strata.cpu.kernels.lut4 import _chunked
from strata.cpu.kernels.simd import I16, I32, V8I32, V16I16, V32I8, Emit
from strata.cpu.kernels.tables import IQ1S_GRID

BB_GGUF, BB = 56, 76
_V4I16 = ir.VectorType(I16, 4)
_V16I32 = ir.VectorType(I32, 16)


# ---------------------------------------------------------------- layout transform (NumPy)


UCODE = (IQ1S_GRID.astype(np.int16) + 1).astype(np.uint8)  # [2048, 8] codes u = g + 1


def repack(w: np.ndarray) -> np.ndarray:
    """IQ1_M rows [R, nb * 56] -> T2 rows [R, nb * 76] (Numba, parallel over rows)."""
    w = np.ascontiguousarray(w).view(np.uint8)
    nb = w.shape[1] // BB_GGUF
    out = np.empty((w.shape[0], nb * BB), np.uint8)
    _repack_rows(w, out, UCODE)
    return out


@njit(cache=True, parallel=True)
def _repack_rows(w, out, ucode):
    nb = w.shape[1] // BB_GGUF
    for r in prange(w.shape[0]):
        for b in range(nb):
            o = b * BB_GGUF
            for i in range(64):
                out[r, 64 * b + i] = 0
            delta = np.uint32(0)
            for k in range(32):  # group of 8 weights 8k..8k+7
                nib = (w[r, o + 32 + k // 2] >> (4 * (k & 1))) & 15
                idx = np.int32(w[r, o + k]) | (np.int32(nib & 7) << 8)
                delta |= np.uint32((nib >> 3) & 1) << k
                for e in range(8):
                    i = 8 * k + e
                    c, m = i // 128, i % 128  # chunk, then plane m // 32 and byte m % 32
                    out[r, 64 * b + 32 * c + m % 32] |= ucode[idx, e] << (2 * (m // 32))
            for k in range(4):
                out[r, 64 * nb + 4 * b + k] = (delta >> (8 * k)) & 255
            for k in range(8):
                out[r, 68 * nb + 8 * b + k] = w[r, o + 48 + k]


def gguf_codes(w: np.ndarray):
    """IQ1_M rows [n, nb * 56] -> (u [n, nb, 256] uint8 in natural weight order, the delta sign
    bits [n, nb] uint32 (bit k: group k of 8), the scale words [n, nb, 8] bytes)."""
    n = w.shape[0]
    bl = w.reshape(n, -1, BB_GGUF)
    nb = bl.shape[1]
    nib = ((bl[..., 32:48, None] >> np.array([0, 4], np.uint8)) & 15).reshape(n, nb, 32)
    idx = bl[..., 0:32].astype(np.int64) | ((nib & 7).astype(np.int64) << 8)
    u = (IQ1S_GRID[idx] + 1).astype(np.uint8).reshape(n, nb, 256)
    dbits = ((nib >> 3) & 1).astype(np.uint32)
    delta = np.bitwise_or.reduce(dbits << np.arange(32, dtype=np.uint32), axis=-1)
    return u, delta, bl[..., 48:56]


@_chunked
def repack_reference(w: np.ndarray) -> np.ndarray:
    """IQ1_M rows [R, nb * 56] -> T2 rows [R, nb * 76]: the NumPy statement of `repack`."""
    u, delta, scales = gguf_codes(w)
    n, nb = delta.shape
    u = u.reshape(n, nb, 2, 4, 32)  # chunk, plane, byte
    codes = u[:, :, :, 0] | (u[:, :, :, 1] << 2) | (u[:, :, :, 2] << 4) | (u[:, :, :, 3] << 6)
    return planes(codes.reshape(n, -1), delta, scales)


def planes(codes: np.ndarray, delta: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Rows [codes | delta dwords | scale words] from codes [n, nb * c], delta [n, nb] uint32
    and scales [n, nb, 8] (T2's planes)."""
    n, nb = delta.shape
    return np.concatenate(
        [codes, delta.astype("<u4").view(np.uint8).reshape(n, -1), scales.reshape(n, -1)], axis=1
    )


def _grid_index() -> np.ndarray:
    u = (IQ1S_GRID.astype(np.int64) + 1) * (3 ** np.arange(8))
    key = u.sum(axis=1)
    inv = np.full(3**8, -1, np.int64)
    inv[key] = np.arange(IQ1S_GRID.shape[0])
    assert np.unique(key).size == IQ1S_GRID.shape[0]  # injective: the repack is invertible
    return inv


@_chunked
def unpack(p: np.ndarray) -> np.ndarray:
    """T2 rows [R, nb * 76] -> the IQ1_M bytes they came from."""
    n = p.shape[0]
    nb = p.shape[1] // BB
    c = p[:, : 64 * nb].reshape(n, nb, 2, 1, 32)
    u = ((c >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3).reshape(n, nb, 256)
    return gguf_blocks(u, p[:, 64 * nb : 68 * nb], p[:, 68 * nb :], "T2 codes")


def gguf_blocks(u: np.ndarray, delta: np.ndarray, scales: np.ndarray, what: str) -> np.ndarray:
    """IQ1_M rows [n, nb * 56] from u [n, nb, 256] (natural order), the delta plane [n, nb * 4]
    and the scale plane [n, nb * 8]; ValueError naming `what` where 8 codes are not a grid row."""
    n, nb = u.shape[:2]
    idx = _grid_index()[(u.reshape(n, nb, 32, 8).astype(np.int64) * (3 ** np.arange(8))).sum(-1)]
    if (idx < 0).any():
        raise ValueError(f"{what} name a ternary group that is not an iq1s grid entry")
    dwords = np.ascontiguousarray(delta).view("<u4").reshape(n, nb, 1)
    dbit = ((dwords >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [n, nb, 32]
    nib = ((idx >> 8) & 7).astype(np.uint8) | (dbit << 3)
    out = np.empty((n, nb, BB_GGUF), np.uint8)
    out[..., 0:32] = (idx & 255).astype(np.uint8)
    out[..., 32:48] = nib[..., 0::2] | (nib[..., 1::2] << 4)
    out[..., 48:56] = scales.reshape(n, nb, 8)
    return out.reshape(n, nb * BB_GGUF)


# ---------------------------------------------------------------- kernels


@intrinsic
def _blk_avx2(typingctx, w, r, qo, do, so, xq, a, xo, x8, go):
    sig = types.int32(
        w,
        types.intp,
        types.intp,
        types.intp,
        types.intp,
        xq,
        types.intp,
        types.intp,
        x8,
        types.intp,
    )

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        b = builder
        if not HAS_AVX2:
            e.trap()
            return ir.Constant(I32, 0)
        wt = sg.args[0]
        pq = e.ptr(wt, args[0], args[1], args[2])
        pd = e.ptr(wt, args[0], args[1], args[3])
        ps = e.ptr(wt, args[0], args[1], args[4])
        px = e.ptr(sg.args[5], args[5], args[6], args[7])
        p8 = e.ptr(sg.args[8], args[8], args[6], args[9])
        # 16 scales sc = 2 ls + 1: ls_s = (word[s // 4] >> 3 (s % 4)) & 7, in 16-bit lanes:
        # a multiply by 2**(13 - 3 k) lifts bits 3k..3k+2 to the top (AVX2 has no per-lane
        # 16-bit shift), a shift by 13 brings them down alone
        words = e.shuffle(e.load(ps, _V4I16), [s // 4 for s in range(16)])
        top = b.mul(words, e.const(V16I16, [1 << (13 - 3 * (s % 4)) for s in range(16)]))
        ls = b.lshr(top, e.splat(V16I16, 13))
        sc = b.or_(b.shl(ls, e.splat(V16I16, 1)), e.splat(V16I16, 1))
        # even scales in the low 128-bit lane, odd in the high: the plane splats are lane-local
        even_odd = list(range(0, 16, 2)) + list(range(1, 16, 2))
        sc8 = e.shuffle(b.shl(sc, e.splat(V16I16, 3)), even_odd)
        acc = e.splat(V8I32, 0)
        three = e.splat(V32I8, 3)
        for c in range(2):
            v = e.load(pq, V32I8, 32 * c)
            for k in range(4):
                u = b.and_(b.lshr(v, e.splat(V32I8, 2 * k)), three) if k else b.and_(v, three)
                p = e.maddubs(u, e.load(px, V32I8, 128 * c + 32 * k))
                s = 8 * c + 2 * k
                acc = b.add(acc, e.madd(p, e.shuffle(sc8, [s // 2] * 8 + [8 + s // 2] * 8)))
        # the delta/offset term: sc_{g/2} (-7 - 2 bit_g) X8_g over the 32 groups
        bits = e.load(pd, I32)
        lanes = e.const(V16I16, [1 << i for i in range(16)])
        for h in range(2):
            half = b.trunc(b.lshr(bits, ir.Constant(I32, 16 * h)), I16)
            neg = b.sext(
                b.icmp_unsigned("!=", b.and_(e.bcast(half, V16I16), lanes), e.splat(V16I16, 0)),
                V16I16,
            )  # -1 where bit set
            coef = b.add(e.splat(V16I16, -7), b.shl(neg, e.splat(V16I16, 1)))
            scg = e.shuffle(sc, [8 * h + g // 2 for g in range(16)])
            acc = b.add(acc, e.madd(e.load(p8, V16I16, 32 * h), b.mul(coef, scg)))
        return e.hsum(acc)

    return sig, codegen


@njit(cache=True)
def dot_t2_avx2(w, r, xq, xd, xb, x8, xf, a):
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        so = 68 * nb + 8 * b
        isum = _blk_avx2(w, r, 64 * b, 64 * nb + 4 * b, so, xq, a, 256 * b, x8, 32 * b)
        d = iq1m_d(w, r, so - 48)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.125)
    return acc
