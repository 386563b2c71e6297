"""Activation quantization as llama.cpp's CPU matmul does it, in NumPy (the oracle for our kernels).

ggml's CPU backend quantizes the activation operand of a matmul to the weight type's vec_dot_type
(`BlockFormat.vec_dot`) before the dot products; to match its logits we must apply the same
rounding to our activations. Per vec_dot type:

- Q8_K (k- and i-quant weights): `quantize_row_q8_K_ref` in ggml-quants.c, which the x86 CPU
  backend calls as is. Blocks of 256; the element of largest magnitude (first one on ties, sign
  kept) maps to -127: `iscale = -127.f/max`, `q = min(127, nearest_int(iscale*x))` where
  nearest_int is the 12582912.f magic-number round (half to even), `d = 1/iscale` as float32.
  An all-zero block gets d = 0, q = 0.
- Q8_0 (Q8_0 weights): the x86 AVX/AVX2/AVX-512 `quantize_row_q8_0` of ggml-cpu (arch/x86), not
  the scalar `quantize_row_q8_0_ref` that gguf-py copies. Blocks of 32: `amax = max|x|`,
  `d = amax/127.f` stored as f16 (F16C, round to nearest even), `id = amax ? 127.f/amax : 0`,
  `q = _mm256_round_ps(x*id, _MM_ROUND_NEAREST)` (half to even). The scalar reference instead uses
  `id = 1/d` and rounds half away from zero, so the two can differ by one in q where x*id sits on
  (or within an ulp of) a .5 tie; d is the same in both.
- F16 / BF16 weights: x rounded to f16 (F16C, nearest even) or to bf16 (GGML_FP32_TO_BF16,
  nearest even on the fp32 bits). F32 weights: no conversion.

All quantization arithmetic is float32, as in ggml (float64 input is first rounded to float32).
NaN inputs are not modelled.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.quant.formats import QK_K, QT, UnsupportedType

QK8_0 = 32
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds a float32 to an integer, ties even


def quantize_q8_K(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_K of each row of `x` [..., n]: (d float32 [..., n/256], qs int8 [..., n]).

    Bit-identical to ggml's `quantize_row_q8_K_ref` (bsums left out: the round trip has no use
    for them).
    """
    xb = _blocks(x, QK_K)  # [..., nb, 256] float32
    ax = np.abs(xb)
    imax = np.argmax(ax, axis=-1)[..., None]  # first index of the largest |x|, as the C loop
    vmax = np.take_along_axis(xb, imax, axis=-1)  # [..., nb, 1], signed
    zero = np.take_along_axis(ax, imax, axis=-1) == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.float32(-127.0) / np.where(zero, np.float32(1), vmax)
        d = np.float32(1.0) / iscale
    v = (iscale * xb + _MAGIC).view(np.int32)  # float32 product, then nearest_int's bit trick
    q = (v & np.int32(0x007FFFFF)) - np.int32(0x00400000)
    q = np.minimum(q, 127)
    q = np.where(zero, 0, q).astype(np.int8)
    d = np.where(zero, np.float32(0), d)[..., 0].astype(np.float32)
    return d, q.reshape(x.shape)


def quantize_q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 of each row of `x` [..., n] as ggml-cpu's x86 SIMD path does it.

    Returns (d float16 [..., n/32], qs int8 [..., n]); see the module docstring for how this
    differs from the scalar reference (and from `gguf.quants.quantize`).
    """
    xb = _blocks(x, QK8_0)  # [..., nb, 32] float32
    amax = np.max(np.abs(xb), axis=-1, keepdims=True)  # [..., nb, 1]
    d = (amax / np.float32(127.0)).astype(np.float16)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(xb * inv)  # float32 product, round half to even (_MM_ROUND_NEAREST)
    q = np.clip(q, -128, 127).astype(np.int8)  # cvtps_epi32 + saturating packs
    return d[..., 0], q.reshape(x.shape)


def roundtrip(x: np.ndarray, vec_dot: GGMLQuantizationType) -> np.ndarray:
    """The activation `x` [..., n] as ggml's CPU matmul sees it after quantizing to `vec_dot`.

    Returns float64 for float64 `x`, float32 otherwise. Q8_K gives d*qs and Q8_0 f16(d)*qs
    (the product is exact in float64, float32-rounded as ggml's dequantize_row_* in float32);
    F16/BF16 give x rounded to that type; F32 returns x unchanged.
    """
    x = np.asarray(x)
    out = np.float64 if x.dtype == np.float64 else np.float32
    try:
        vd = QT(int(vec_dot))
    except ValueError:
        raise UnsupportedType(f"unknown activation type {vec_dot!r}") from None
    if vd == QT.F32:
        return x.astype(out, copy=True)
    x32 = x.astype(np.float32)
    if vd == QT.Q8_K:
        d, q = quantize_q8_K(x32)
        qb = q.reshape(*q.shape[:-1], -1, QK_K).astype(out)
        return (d.astype(out)[..., None] * qb).reshape(x.shape)
    if vd == QT.Q8_0:
        d, q = quantize_q8_0(x32)
        qb = q.reshape(*q.shape[:-1], -1, QK8_0).astype(out)
        return (d.astype(out)[..., None] * qb).reshape(x.shape)
    if vd == QT.F16:
        with np.errstate(over="ignore"):  # beyond 65504 becomes inf, as F16C does
            return x32.astype(np.float16).astype(out)
    if vd == QT.BF16:
        return _bf16_round(x32).astype(out)
    raise UnsupportedType(
        f"no activation round trip for {vd.name} (supported: Q8_K, Q8_0, F16, BF16, F32)"
    )


def _blocks(x: np.ndarray, qk: int) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % qk:
        raise ValueError(f"row length must be a multiple of {qk}, got shape {x.shape}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // qk, qk)


def _bf16_round(x32: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 -> fp32 as GGML_FP32_TO_BF16: round to nearest even, NaN kept quiet."""
    u = np.ascontiguousarray(x32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r = (u.astype(np.uint64) + (0x7FFF + ((u >> 16) & 1))) >> 16
    r = np.where(nan, (u >> 16) | np.uint32(64), r).astype(np.uint32)
    return (r << np.uint32(16)).view(np.float32)
