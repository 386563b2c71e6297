"""Random but valid quantized tensors, for kernel tests and benchmarks without a model file.

Every field of every block is drawn at random (grid indices, sign bits, sub-block scales, high
bits), so a kernel that reads a bit from the wrong place gives a wrong answer; only the f16
super-block scales are computed, so that the dequantized tensor has the standard deviation asked
for. The super-block scale also varies from block to block (a uniform factor in [0.5, 1.5]) so a
kernel that applies the wrong block's scale is caught too. MXFP4's scale is a power of two (E8M0):
each block takes one of the two powers around its target scale at random, with the odds that keep
the expected square of the scale, so the tensor's std is still linear in the requested one.

The std of a tensor whose scales are all "unit" is measured once per type by dequantizing a fixed
sample with `gguf.quants` (the reference codec) and cached; the scale is then linear in `d`.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from strata.quant.formats import QT, fmt

# per-block factor on the super-block scale: uniform in [_U_LO, _U_HI]
_U_LO, _U_HI = 0.5, 1.5
# Q4_K/Q5_K: mean of the unsigned quant (q in 0..15 or 0..31), so dmin = _KMEAN * d centres blocks
_KMEAN = {QT.Q4_K: 7.5, QT.Q5_K: 15.5}
_CALIB_BLOCKS = 4096
_CALIB_SEED = 0x5EED


def random_quantized(
    qtype: GGMLQuantizationType, shape: tuple[int, ...], rng: np.random.Generator, std: float
) -> np.ndarray:
    """Raw bytes (uint8 `[*shape[:-1], row_bytes]`) of a random tensor of ggml type `qtype`.

    Dequantized (`gguf.quants.dequantize`) it is finite, about zero-mean, with std close to `std`.
    `shape` is the numpy shape of the dequantized tensor; its last axis must be whole blocks.
    The bytes depend only on `qtype`, `shape`, `std` and the state of `rng`.
    """
    f = fmt(qtype)
    shape = tuple(int(s) for s in shape)
    if not shape:
        raise ValueError("shape must have at least one axis")
    if not (np.isfinite(std) and std > 0):
        raise ValueError(f"std must be a positive finite number, got {std!r}")
    row_bytes = f.row_bytes(shape[-1])
    out_shape = (*shape[:-1], row_bytes)
    qt = f.qtype

    if qt in (QT.F32, QT.F16, QT.BF16):
        x = rng.standard_normal(shape, dtype=np.float32)
        x *= np.float32(std)
        if qt == QT.F32:
            return x.view(np.uint8).reshape(out_shape)
        if qt == QT.F16:
            return x.astype(np.float16).view(np.uint8).reshape(out_shape)
        u = x.view(np.uint32)  # fp32 -> bf16, round to nearest even (no NaN can occur here)
        bits = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
        return bits.view(np.uint8).reshape(out_shape)

    n_blocks = int(np.prod(shape, dtype=np.int64)) // f.block_elems
    scale = float(std) / _unit_std(qt)
    blocks = _random_blocks(qt, n_blocks, rng, scale)
    return blocks.reshape(out_shape)


def _random_blocks(qt: QT, n_blocks: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """`n_blocks` random blocks [n_blocks, block_bytes] whose super-block scale is ~`scale`."""
    f = fmt(qt)
    raw = rng.integers(0, 256, size=(n_blocks, f.block_bytes), dtype=np.uint8)
    view = raw.view(f.block_dtype())[:, 0]  # structured view: fields by name, same memory
    u = rng.uniform(_U_LO, _U_HI, n_blocks).astype(np.float32)
    d = _to_f16(u * np.float32(scale))

    if qt == QT.MXFP4:
        view["e"] = _e8m0(u * np.float32(scale), rng)
    elif qt == QT.Q8_0:
        # a real Q8_0 block never holds -128 (the quantizer's range is [-127, 127])
        view["qs"] = rng.integers(-127, 128, size=(n_blocks, 32), dtype=np.int8)
        view["d"] = d
    elif qt in (QT.Q4_K, QT.Q5_K):
        # mins close to the scales (m = sc + small noise) with dmin = mean(q) * d: every sub-block
        # is about zero-mean, yet m != sc in most sub-blocks so swapped fields are caught
        sc = rng.integers(0, 64, size=(n_blocks, 8), dtype=np.int16)
        m = np.clip(sc + rng.integers(-3, 4, size=(n_blocks, 8), dtype=np.int16), 0, 63)
        view["scales"] = _pack_scale_min_k4(sc.astype(np.uint8), m.astype(np.uint8))
        view["d"] = d
        view["dmin"] = _to_f16(d.astype(np.float32) * np.float32(_KMEAN[qt]))
    elif qt == QT.IQ1_M:
        # the f16 super-block scale lives in the top nibbles of the four u16 scale words
        bits = d.view(np.uint16)
        words = view["scales"].copy().view("<u2")  # [n_blocks, 4]
        for k in range(4):
            words[:, k] = (words[:, k] & np.uint16(0x0FFF)) | (
                ((bits >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12)
            )
        view["scales"] = words.view(np.uint8)
    else:
        # Q6_K, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_S: every bit pattern of every other field is
        # a valid block, so only the f16 scale needs writing
        view["d"] = d
    return raw


# E8M0 byte of the scale 1 as ggml reads MXFP4 (GGML_E8M0_TO_FP32_HALF: 2**(e - 128), the
# E2M1 values being doubled)
_E8M0_ONE = 128


def _e8m0(target: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """E8M0 bytes of scales 2**k near `target` (float32 [n]): the power below or above, the one
    above with probability p so that E[scale**2] = target**2 (p = (t**2 / 4**k_lo - 1) / 3)."""
    k = np.floor(np.log2(target.astype(np.float64)))
    p = ((target.astype(np.float64) / 2.0**k) ** 2 - 1.0) / 3.0
    k = k + (rng.random(target.shape) < p)
    e = k + _E8M0_ONE
    if np.any(e < 2) or np.any(e > 254):  # (e < 2: ggml's subnormal halves; 255: NaN in OCP)
        raise ValueError("requested std is out of range for an E8M0 block scale")
    return e.astype(np.uint8)


def _pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Pack 8 six-bit scales and 8 six-bit mins per block into ggml's 12-byte k4 layout."""
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 0x3F) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return out


def _to_f16(v: np.ndarray) -> np.ndarray:
    """float32 -> f16, refusing scales that vanish or overflow in half precision."""
    h = v.astype(np.float16)
    if not np.all(np.isfinite(h)) or np.any(h == 0):
        raise ValueError("requested std is out of range for an f16 block scale")
    return h


@cache
def _unit_std(qt: QT) -> float:
    """Std of the dequantized values of random blocks whose super-block scale factor is 1."""
    rng = np.random.default_rng(_CALIB_SEED)
    blocks = _random_blocks(qt, _CALIB_BLOCKS, rng, 1.0)
    return float(np.std(dequantize(blocks, qt).astype(np.float64)))
