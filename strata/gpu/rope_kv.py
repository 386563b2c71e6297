"""q/k RMSNorm + NEOX RoPE + f16 KV append (kernels/rope_kv.cu): launcher and NumPy reference."""

from __future__ import annotations

import numpy as np

from strata.gpu.rawmod import Kernels, f32, i32, ptr


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
) -> None:
    """qkv [T, H*Dh + G*Dh + G*Dv]; k_cache/v_cache: one layer, [G, S_cap, Dh] uint16 (f16).

    Tokens sit at positions pos0..pos0+T-1, or, with `pos_dev` (a device int32 array [1]), at
    pos_dev[0].. read by the kernel itself: the launch then does not change with the position
    (`pos0` is ignored), so a captured CUDA graph can replay it at every decode step."""
    if pos_dev is not None and (pos_dev.dtype != np.int32 or pos_dev.size < 1):
        raise ValueError("pos_dev must be a device int32 array holding the start position")
    h, g, dh, dv = dims
    threads = -(-max(dh, dv) // K.warp) * K.warp
    K.fn("rope_kv.cu", "qk_norm_rope_kv")(
        (h + 2 * g, t),
        (threads,),
        (
            qkv,
            i32(h),
            i32(g),
            i32(dh),
            i32(dv),
            ptr(q_norm),
            ptr(k_norm),
            f32(eps),
            inv_freq,
            i32(pos0),
            q_out,
            k_cache,
            v_cache,
            i32(k_cache.shape[1]),
            ptr(pos_dev),
        ),
    )


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


def qk_norm_rope_kv_ref(qkv, dims, q_norm, k_norm, eps, inv_freq, pos0):
    """-> q [T, H, Dh] (f16 values as float32), k [T, G, Dh] f16, v [T, G, Dv] f16."""
    h, g, dh, dv = dims
    t = qkv.shape[0]
    q = qkv[:, : h * dh].reshape(t, h, dh)
    k = qkv[:, h * dh : (h + g) * dh].reshape(t, g, dh)
    v = qkv[:, (h + g) * dh :].reshape(t, g, dv)
    if q_norm is not None:
        q = rms_norm_ref(q, q_norm, eps)
        k = rms_norm_ref(k, k_norm, eps)
    q, k = rope_ref(q, pos0, inv_freq), rope_ref(k, pos0, inv_freq)
    return (
        q.astype(np.float16).astype(np.float32),
        k.astype(np.float16),
        v.astype(np.float16),
    )
