"""Activation quantization in Numba, bit-identical to `strata.quant.activation` (ggml's CPU path).

The kernels take activations in one layout for every weight format ("act" arrays, one row per
activation vector of length n):

    xq [rows, n]      int8     Q8 quants (Q8_K: blocks of 256; Q8_0: blocks of 32)
    xd [rows, n/32]   float32  block scales: Q8_K uses the first n/256 columns, Q8_0 all n/32
                               (the f16 scale of Q8_0 already widened to float32)
    xb [rows, n/16]   int16    sums of 16 consecutive quants (Q8_K: ggml's block_q8_K.bsums; Q8_0:
                               the MXFP4 kernels' offset term)
    x8 [rows, n/8]    int16    sums of 8 consecutive quants (IQ1_M's delta term)
    xf [rows, n]      float32  the activation rounded to the weight's float type (F16/BF16/F32);
                               for Q8_K, its first n bytes of a row hold the quants again in
                               position-major order (`pm_order`: the IQ3_XXS pm kernel's x)

Only the arrays a weight type needs are written (`quantize_row`'s `vec_dot` code).
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType
from numba import njit, prange

from strata.cpu.kernels.common import round_bf16, round_f16
from strata.quant.formats import QK_K, QT

QK8_0 = 32

# activation codes (the vec_dot type of the weight), stable integers for the jitted code
ACT_Q8_K, ACT_Q8_0, ACT_F16, ACT_BF16, ACT_F32 = 0, 1, 2, 3, 4
ACT_CODES = {
    QT.Q8_K: ACT_Q8_K,
    QT.Q8_0: ACT_Q8_0,
    QT.F16: ACT_F16,
    QT.BF16: ACT_BF16,
    QT.F32: ACT_F32,
}


def act_code(vec_dot: GGMLQuantizationType) -> int:
    return ACT_CODES[QT(int(vec_dot))]


@njit(cache=True, inline="always")
def pm_order(i):
    """Position-major byte of quant i of a Q8_K block: 64 p + g for i = 4 g + p (pm_avx512.py)."""
    return 64 * (i % 4) + i // 4


@njit(cache=True)
def q8_K_blocks(x, qs, d, bs, s8, b0, b1, xp):
    """Quantize Q8_K blocks b0..b1-1 of one row x [n] (float32): qs [n], d, bs [n/16], s8 [n/8],
    and the quants in position-major order into xp (the row of xf as int8 bytes)."""
    for b in range(b0, b1):
        o = b * QK_K
        amax = np.float32(0.0)
        vmax = np.float32(0.0)
        for i in range(QK_K):  # first element of largest magnitude, sign kept (as the C loop)
            ax = abs(x[o + i])
            if ax > amax:
                amax = ax
                vmax = x[o + i]
        if amax == 0:
            d[b] = 0
            for i in range(QK_K):
                qs[o + i] = 0
        else:
            iscale = np.float32(-127.0) / vmax
            for i in range(QK_K):
                # nearest_int's magic-number round is round-half-even for |v| < 2**22
                q = np.int32(np.rint(np.float32(iscale * x[o + i])))
                qs[o + i] = min(q, 127)
            d[b] = np.float32(1.0) / iscale
        for g in range(QK_K // 8):
            s = np.int32(0)
            for i in range(8):
                s += qs[o + 8 * g + i]
            s8[o // 8 + g] = s
        for g in range(QK_K // 16):
            bs[o // 16 + g] = s8[o // 8 + 2 * g] + s8[o // 8 + 2 * g + 1]
        for i in range(QK_K):
            xp[o + pm_order(i)] = qs[o + i]


@njit(cache=True)
def q8_K_row(x, qs, d, bs, s8, xp):
    """Quantize one row x [n] (float32) to Q8_K: qs [n], d [>= n/256], bs [n/16], s8 [n/8],
    xp [n] int8 (position-major quants)."""
    q8_K_blocks(x, qs, d, bs, s8, np.int64(0), x.shape[0] // QK_K, xp)


@njit(cache=True)
def q8_0_blocks(x, qs, d, bs, b0, b1):
    """Quantize Q8_0 blocks b0..b1-1 of one row x [n] as ggml-cpu's x86 SIMD path (d: f16 value),
    and the sums of each 16 quants into bs [n/16]."""
    for b in range(b0, b1):
        o = b * QK8_0
        amax = np.float32(0.0)
        for i in range(QK8_0):
            amax = max(amax, abs(x[o + i]))
        d[b] = round_f16(amax / np.float32(127.0))
        inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
        for i in range(QK8_0):
            q = np.rint(np.float32(x[o + i] * inv))
            qs[o + i] = np.int8(min(max(q, -128.0), 127.0))
        for h in range(2):
            s = np.int32(0)
            for i in range(16):
                s += qs[o + 16 * h + i]
            bs[2 * b + h] = s


@njit(cache=True)
def q8_0_row(x, qs, d, bs):
    """Quantize one row x [n] to Q8_0 as ggml-cpu's x86 SIMD path: qs [n], d [n/32] (f16 value),
    bs [n/16] (sums of 16 quants)."""
    q8_0_blocks(x, qs, d, bs, np.int64(0), x.shape[0] // QK8_0)


@njit(cache=True)
def float_row(x, code, xf, i0=0, i1=-1):
    """Round x[i0:i1] to the weight's float type (F16, BF16) or copy it (F32); i1=-1: to the end."""
    for i in range(i0, x.shape[0] if i1 < 0 else i1):
        if code == ACT_F16:
            xf[i] = round_f16(x[i])
        elif code == ACT_BF16:
            xf[i] = round_bf16(x[i])
        else:
            xf[i] = x[i]


@njit(cache=True)
def quantize_row(x, code, r, xq, xd, xb, x8, xf):
    """Quantize row x [n] for a weight whose vec_dot type is `code` into row r of the act arrays."""
    if code == ACT_Q8_K:
        q8_K_row(x, xq[r], xd[r], xb[r], x8[r], xf[r].view(np.int8))
    elif code == ACT_Q8_0:
        q8_0_row(x, xq[r], xd[r], xb[r])
    else:
        float_row(x, code, xf[r], np.int64(0), np.int64(-1))


@njit(cache=True, inline="always")
def act_unit(code):
    """Elements per independent quantization unit (a Q8_K super-block, else 32)."""
    return QK_K if code == ACT_Q8_K else QK8_0


@njit(cache=True)
def quantize_units(x, code, r, xq, xd, xb, x8, xf, u0, u1):
    """Units u0..u1-1 (`act_unit` elements each) of row x into row r: a row split over threads
    gives the same bytes as `quantize_row` (every unit is quantized on its own)."""
    if code == ACT_Q8_K:
        q8_K_blocks(x, xq[r], xd[r], xb[r], x8[r], u0, u1, xf[r].view(np.int8))
    elif code == ACT_Q8_0:
        q8_0_blocks(x, xq[r], xd[r], xb[r], u0, u1)
    else:
        float_row(x, code, xf[r], u0 * QK8_0, u1 * QK8_0)


@njit(cache=True, parallel=True)
def quantize_rows_parallel(x, code, xq, xd, xb, x8, xf):
    for r in prange(x.shape[0]):
        quantize_row(x[r], code, r, xq, xd, xb, x8, xf)


@njit(cache=True)
def quantize_rows(x, code, xq, xd, xb, x8, xf):
    for r in range(x.shape[0]):
        quantize_row(x[r], code, r, xq, xd, xb, x8, xf)


@njit(cache=True)
def _roundtrip_rows(x, code, out):
    """out [rows, n] = each row of x (float32) quantized for weights of vec_dot `code` (Q8_K or
    Q8_0) and taken back: d * q in float32, as `strata.quant.activation.roundtrip` does."""
    n = x.shape[1]
    unit = act_unit(code)
    qs = np.empty(n, np.int8)
    d = np.empty(n // QK8_0, np.float32)
    bs = np.empty(n // 16, np.int16)
    s8 = np.empty(n // 8, np.int16)
    xp = np.empty(n, np.int8)
    for r in range(x.shape[0]):
        if code == ACT_Q8_K:
            q8_K_blocks(x[r], qs, d, bs, s8, 0, n // QK_K, xp)
        else:
            q8_0_blocks(x[r], qs, d, bs, 0, n // QK8_0)
        for i in range(n):
            out[r, i] = d[i // unit] * np.float32(qs[i])


def roundtrip(x: np.ndarray, vec_dot: GGMLQuantizationType) -> np.ndarray:
    """`strata.quant.activation.roundtrip` (the same bits) by the compiled quantizers for a
    float32 x and a Q8_K / Q8_0 vec_dot type; anything else goes to the NumPy one."""
    from strata.quant.activation import roundtrip as reference

    vd = int(vec_dot)
    code = ACT_Q8_K if vd == QT.Q8_K else ACT_Q8_0 if vd == QT.Q8_0 else -1
    x = np.asarray(x)
    if code < 0 or x.dtype != np.float32 or x.ndim == 0 or x.shape[-1] % act_unit(code):
        return reference(x, vec_dot)
    x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]))
    out = np.empty(x2.shape, np.float32)
    _roundtrip_rows(x2, code, out)
    return out.reshape(x.shape)


def alloc_act(rows: int, n: int) -> tuple[np.ndarray, ...]:
    """Empty act arrays (xq, xd, xb, x8, xf) for `rows` activation vectors of length `n`."""
    if n % QK8_0:
        raise ValueError(f"activation length {n} is not a multiple of {QK8_0}")
    return (
        np.zeros((rows, n), np.int8),
        np.zeros((rows, n // QK8_0), np.float32),
        np.zeros((rows, n // 16), np.int16),
        np.zeros((rows, n // 8), np.int16),
        np.zeros((rows, n), np.float32),
    )


def quantize_act(x: np.ndarray, vec_dot: GGMLQuantizationType) -> tuple[np.ndarray, ...]:
    """x [rows, n] -> act arrays (xq, xd, xb, x8, xf) for weights whose vec_dot type is given."""
    x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
    act = alloc_act(*x.shape)
    quantize_rows(x, act_code(vec_dot), *act)
    return act


def quantize_q8_K(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Same contract as `strata.quant.quantize_q8_K`: (d float32 [..., n/256], qs int8 [..., n])."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    xq, xd, *_ = quantize_act(x.reshape(-1, n), QT.Q8_K)
    return xd[:, : n // QK_K].reshape(*x.shape[:-1], n // QK_K), xq.reshape(x.shape)


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Same contract as `strata.quant.quantize_q8_0`: (d float16 [..., n/32], qs int8 [..., n])."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    if n % QK8_0:
        raise ValueError(f"row length must be a multiple of {QK8_0}, got shape {x.shape}")
    x2 = np.ascontiguousarray(x.reshape(-1, n))
    xq = np.zeros(x2.shape, np.int8)
    xd = np.zeros((x2.shape[0], n // QK8_0), np.float32)
    bs = np.zeros(n // 16, np.int16)
    for r in range(x2.shape[0]):
        q8_0_row(x2[r], xq[r], xd[r], bs)
    return xd.astype(np.float16).reshape(*x.shape[:-1], n // QK8_0), xq.reshape(x.shape)
