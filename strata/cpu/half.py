"""Float16 conversions at SIMD speed for the host tier's attention (its f16 KV cache, the f16
rounding of q and of the softmax probabilities that llama.cpp's f16 attention implies).

NumPy's float16 casts run ~1-2 ns an element on the dev VM (no F16C path): at 4K positions they
cost more than the attention's arithmetic. `to_f32` and `round_f16` give NumPy's results bit for
bit (IEEE conversions, round to nearest even) through F16C (vcvtph2ps / vcvtps2ph, 8 lanes),
with NumPy's casts where the host lacks F16C or the portable kernels are forced.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.features import simd_enabled
from strata.cpu.kernels.simd import f16x8_to_f32, f32x8_round_f16


@njit(cache=True)
def _to_f32(src, dst):
    n = src.shape[0] - src.shape[0] % 8
    for i in range(0, n, 8):
        f16x8_to_f32(src, i, dst, i)


@njit(cache=True)
def _round_f16(src, dst):
    n = src.shape[0] - src.shape[0] % 8
    for i in range(0, n, 8):
        f32x8_round_f16(src, i, dst, i)


def to_f32(a: np.ndarray) -> np.ndarray:
    """`a.astype(np.float32)` for a float16 array (a new array, a's shape)."""
    if not simd_enabled():
        return a.astype(np.float32)
    src = np.ascontiguousarray(a).reshape(-1).view(np.uint16)
    out = np.empty(src.shape[0], np.float32)
    _to_f32(src, out)
    tail = src.shape[0] % 8
    if tail:
        out[-tail:] = src[-tail:].view(np.float16).astype(np.float32)
    return out.reshape(a.shape)


def round_f16(a: np.ndarray) -> np.ndarray:
    """`a.astype(np.float16).astype(np.float32)` for a float32 array (a new array)."""
    if not simd_enabled():
        with np.errstate(over="ignore"):
            return a.astype(np.float16).astype(np.float32)
    src = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
    out = np.empty_like(src)
    _round_f16(src, out)
    tail = src.shape[0] % 8
    if tail:
        with np.errstate(over="ignore"):  # past f16's range: inf, as vcvtps2ph gives
            out[-tail:] = src[-tail:].astype(np.float16).astype(np.float32)
    return out.reshape(a.shape)
