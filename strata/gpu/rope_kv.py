"""q/k RMSNorm + NEOX RoPE + KV append (kernels/rope_kv.cu): launcher and NumPy reference.

The KV cache is f16 (uint16 bits) or int8: quants with one float32 scale per cached row (per
token and KV head, for K and for V), d = absmax / 127 and q = rint(x / d) in float32
(`quantize_kv_rows`, the rounding both tiers use). A row reads back as q * d.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from strata.cpu.kv import quantize_kv_rows
from strata.cpu.rope import RopeTable
from strata.gpu.rawmod import Kernels, f32, i32, ptr

U16 = np.dtype(np.uint16)


class RopeScaling(NamedTuple):
    """strata.cpu.rope.RopeTable's scaling on the device: ramp [Dh/2] float32 (YaRN) or None."""

    ramp: object
    fs: float
    mscale: float

    @classmethod
    def of(cls, cp, table: RopeTable) -> RopeScaling | None:
        """The scaling of a host RopeTable (None where it has none), ramp uploaded once."""
        if table.fs == 1 and table.mscale == 1:
            return None
        ramp = None if table.ramp is None else cp.asarray(table.ramp)
        return cls(ramp, float(table.fs), float(table.mscale))


def qk_norm_rope_kv(
    K: Kernels,
    qkv,
    t: int,
    dims: tuple[int, int, int, int],
    q_norm,
    k_norm,
    eps: float,
    inv_freq,
    pos0: int,
    q_out,
    k_cache,
    v_cache,
    pos_dev=None,
    k_scale=None,
    v_scale=None,
    scaling: RopeScaling | None = None,
) -> None:
    """qkv [T, H*Dh + G*Dh + G*Dv]; k_cache/v_cache: one layer, [G, S_cap, Dh] uint16 (f16),
    or int8 with k_scale/v_scale [G, S_cap] float32 (the int8 cache: `quantize_kv_rows`).

    Tokens sit at positions pos0..pos0+T-1, or, with `pos_dev` (a device int32 array [1]), at
    pos_dev[0].. read by the kernel itself: the launch then does not change with the position
    (`pos0` is ignored), so a captured CUDA graph can replay it at every decode step.
    `scaling`: the model's RoPE scaling (YaRN: gpt-oss), None for plain NEOX."""
    if pos_dev is not None and (pos_dev.dtype != np.int32 or pos_dev.size < 1):
        raise ValueError("pos_dev must be a device int32 array holding the start position")
    h, g, dh, dv = dims
    threads = -(-max(dh, dv) // K.warp) * K.warp
    sc = scaling or RopeScaling(None, 1.0, 1.0)
    head = (qkv, i32(h), i32(g), i32(dh), i32(dv), ptr(q_norm), ptr(k_norm), f32(eps), inv_freq,
            ptr(sc.ramp), f32(sc.fs), f32(sc.mscale))  # fmt: skip
    if kv_is_int8(k_cache, v_cache, k_scale, v_scale):
        K.fn("rope_kv.cu", "qk_norm_rope_kv_i8")(
            (h + 2 * g, t),
            (threads,),
            (*head, i32(pos0), q_out, k_cache, v_cache, k_scale, v_scale,
             i32(k_cache.shape[1]), ptr(pos_dev)),
        )  # fmt: skip
        return
    K.fn("rope_kv.cu", "qk_norm_rope_kv")(
        (h + 2 * g, t),
        (threads,),
        (*head, i32(pos0), q_out, k_cache, v_cache, i32(k_cache.shape[1]), ptr(pos_dev)),
    )


def kv_is_int8(k_cache, v_cache, k_scale, v_scale) -> bool:
    """Whether a layer's cache is int8 (then with its scales [G, S_cap] float32), else f16;
    a mixed or incomplete set is refused."""
    if k_scale is None and v_scale is None and k_cache.dtype == U16 and v_cache.dtype == U16:
        return False  # the f16 cache: the common case, checked first (eager decode calls this)
    kinds = {np.dtype(k_cache.dtype), np.dtype(v_cache.dtype)}
    if kinds == {np.dtype(np.uint16)}:
        if k_scale is not None or v_scale is not None:
            raise ValueError("an f16 KV cache takes no scales")
        return False
    if kinds != {np.dtype(np.int8)}:
        raise ValueError(f"KV cache must be uint16 (f16) or int8, got {sorted(map(str, kinds))}")
    for c, sc, n in ((k_cache, k_scale, "k"), (v_cache, v_scale, "v")):
        if sc is None or np.dtype(sc.dtype) != np.float32 or tuple(sc.shape) != c.shape[:2]:
            raise ValueError(f"an int8 KV cache needs {n}_scale float32 {c.shape[:2]}")
    return True


def rms_norm_ref(x, w, eps):
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + np.float32(eps))).astype(np.float32)) * w


def rope_ref(x: np.ndarray, pos0: int, inv_freq: np.ndarray) -> np.ndarray:
    """HostTier.rope: NEOX rotation of x [T, heads, Dh] at positions pos0.."""
    t = x.shape[0]
    theta = np.arange(pos0, pos0 + t, dtype=np.float32)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)


def qk_norm_rope_kv_ref(qkv, dims, q_norm, k_norm, eps, inv_freq, pos0, kv_type: str = "f16"):
    """-> q [T, H, Dh] (f16 values as float32), k [T, G, Dh] f16, v [T, G, Dv] f16; with
    kv_type "int8": q, (k8 [T, G, Dh] int8, kd [T, G] float32), (v8, vd) instead."""
    h, g, dh, dv = dims
    t = qkv.shape[0]
    q = qkv[:, : h * dh].reshape(t, h, dh)
    k = qkv[:, h * dh : (h + g) * dh].reshape(t, g, dh)
    v = qkv[:, (h + g) * dh :].reshape(t, g, dv)
    if q_norm is not None:
        q = rms_norm_ref(q, q_norm, eps)
        k = rms_norm_ref(k, k_norm, eps)
    q, k = rope_ref(q, pos0, inv_freq), rope_ref(k, pos0, inv_freq)
    if kv_type == "int8":
        return q.astype(np.float16).astype(np.float32), quantize_kv_rows(k), quantize_kv_rows(v)
    return (
        q.astype(np.float16).astype(np.float32),
        k.astype(np.float16),
        v.astype(np.float16),
    )
