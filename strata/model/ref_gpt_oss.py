"""The reference forward's pieces that gpt-oss adds (strata/model/reference.py calls them): scaled
RoPE angles (linear, YaRN), the causal mask of a sliding window, the softmax with a sink logit per
head, router gating by a softmax over the picked logits, and the clamped SwiGLU of gpt-oss.

Each takes `llama`: copy llama.cpp CPU's float32 arithmetic (ggml-cpu ops.cpp rope_yarn,
soft_max with sinks, swiglu_oai) instead of computing in float64.
Shape letters: see strata/model/args.py (T, S, H, K, Dh).
"""

from __future__ import annotations

import numpy as np

from strata.model.args import SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT, ModelArgs

F32 = np.float32


def _yarn_corr_dims(n_dims: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float):
    """ggml_rope_yarn_corr_dims: the pair indices where YaRN's ramp starts and ends (float32)."""

    def corr(n_rot: float) -> F32:
        num = F32(n_dims) * np.log(F32(n_ctx_orig) / (F32(n_rot) * F32(2) * F32(np.pi)))
        return F32(num / (F32(2) * np.log(F32(base))))

    lo = np.floor(corr(beta_fast))
    hi = np.ceil(corr(beta_slow))
    return F32(max(0.0, lo)), F32(min(n_dims - 1.0, hi))


def rope_angles(a: ModelArgs, pos: np.ndarray, llama: bool) -> tuple[np.ndarray, float]:
    """NEOX angles with RoPE scaling -> (theta [T, Dh/2], mscale): cos/sin are scaled by mscale.

    linear: every angle times freq_scale = 1/factor. YaRN: pair i mixes the interpolated angle
    (times freq_scale) and the original by a ramp between the correction dims, and cos/sin grow
    by 1 + 0.1 ln(factor) (llama.cpp cancels its own yarn_attn_factor against that, leaving the
    file's attn_factor)."""
    dh, half = a.head_dim, a.head_dim // 2
    yarn = a.rope_scaling == "yarn"
    n_ctx_orig = a.rope_orig_ctx or a.n_ctx_train
    if not llama:
        inv = a.rope_theta ** (-np.arange(half) * 2.0 / dh)
        extrap = pos[:, None] * inv[None, :]  # [T, Dh/2]
        fs = 1.0 / a.rope_factor
        if not yarn:
            return fs * extrap, a.rope_attn_factor
        lo, hi = _yarn_corr_dims(dh, n_ctx_orig, a.rope_theta, a.yarn_beta_fast, a.yarn_beta_slow)
        y = (np.arange(half) - float(lo)) / max(0.001, float(hi) - float(lo))
        ramp = 1.0 - np.clip(y, 0.0, 1.0)  # [Dh/2] 1: extrapolate (high frequencies)
        theta = fs * extrap * (1.0 - ramp) + extrap * ramp
        return theta, a.rope_attn_factor * (1.0 + 0.1 * np.log(a.rope_factor))
    # llama.cpp: theta_scale = powf(base, -2/n_dims), powers by repeated f32 product
    scale = F32(a.rope_theta) ** F32(-2.0 / dh)
    inv = np.empty(half, F32)
    acc = F32(1.0)
    for i in range(half):
        inv[i] = acc
        acc = F32(acc * scale)
    extrap = pos[:, None].astype(F32) * inv[None, :]  # [T, Dh/2] float32
    fs = F32(1.0) / F32(a.rope_factor)  # hparams.rope_freq_scale_train
    interp = (fs * extrap).astype(F32)
    attn = F32(a.rope_attn_factor)
    if not yarn:
        return interp.astype(np.float64), float(attn)
    factor = F32(1.0) / fs  # llama_context: cparams.yarn_attn_factor, then cancelled
    m = F32(F32(0.1) * np.log(factor) + F32(1.0)) if factor > 1 else F32(1.0)
    attn = F32(F32(m * (F32(1.0) / (F32(1.0) + F32(0.1) * np.log(factor)))) * attn)
    lo, hi = _yarn_corr_dims(dh, n_ctx_orig, a.rope_theta, a.yarn_beta_fast, a.yarn_beta_slow)
    y = ((np.arange(half, dtype=F32) - lo) / max(F32(0.001), F32(hi - lo))).astype(F32)
    ramp = (F32(1.0) - np.minimum(F32(1.0), np.maximum(F32(0.0), y))).astype(F32)
    theta = (interp * (F32(1.0) - ramp) + extrap * ramp).astype(F32)
    mscale = F32(attn * F32(F32(1.0) + F32(0.1) * np.log(F32(1.0) / fs)))
    return theta.astype(np.float64), float(mscale)


def visible(n_q: int, pos0: int, n_k: int, window: int) -> np.ndarray:
    """[T, S] bool: key position s is visible to the query at position pos0 + t (causal; with
    window > 0 also pos - s < window: llama.cpp's LLAMA_SWA_TYPE_STANDARD)."""
    qp = pos0 + np.arange(n_q)[:, None]
    kp = np.arange(n_k)[None, :]
    ok = kp <= qp
    if window > 0:
        ok &= qp - kp < window
    return ok


def softmax_with_sinks(scores: np.ndarray, sinks: np.ndarray | None) -> np.ndarray:
    """softmax over the last axis of scores [H, T, S] (masked = -inf) with, where given, one more
    logit per head (sinks [H]) in the denominator only: the probabilities sum to under 1."""
    m = scores.max(axis=-1, keepdims=True)  # [H, T, 1]
    if sinks is not None:
        m = np.maximum(m, sinks[:, None, None])
    p = np.exp(scores - m)
    total = p.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks[:, None, None] - m)
    return p / total


def softmax_weight_topk(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The K largest logits [T, E] (stable order on ties), then a softmax over those K:
    (ids [T, K], weights [T, K])."""
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :k]  # [T, K]
    sel = np.take_along_axis(logits, ids, axis=-1)
    w = np.exp(sel - sel.max(axis=-1, keepdims=True))
    return ids, w / w.sum(axis=-1, keepdims=True)


def swiglu_oai(gate: np.ndarray, up: np.ndarray, llama: bool) -> np.ndarray:
    """gpt-oss's activation: g = min(gate, 7), u = clip(up, -7, 7);
    g * sigmoid(1.702 g) * (u + 1)."""
    if llama:  # ggml_compute_forward_swiglu_oai_f32
        x = np.minimum(gate.astype(F32), F32(SWIGLU_OAI_LIMIT))
        y = np.clip(up.astype(F32), F32(-SWIGLU_OAI_LIMIT), F32(SWIGLU_OAI_LIMIT))
        glu = x / (F32(1.0) + np.exp(F32(SWIGLU_OAI_ALPHA) * -x))
        return (glu * (y + F32(1.0))).astype(np.float64)
    x = np.minimum(gate, SWIGLU_OAI_LIMIT)
    y = np.clip(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return x / (1.0 + np.exp(-SWIGLU_OAI_ALPHA * x)) * (y + 1.0)
