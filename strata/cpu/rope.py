"""NEOX RoPE's angles in float32 as ggml-cpu computes them, with llama.cpp's RoPE scaling (linear,
YaRN: gpt-oss), and the clamped SwiGLU of gpt-oss. The float64 reference of both is
strata/model/ref_gpt_oss.py; the host tier's results are held to it through the forward tests.

    T = tokens, Dh = head dim
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32 = np.float32
SWIGLU_OAI_ALPHA = F32(1.702)  # llama.cpp's constants (build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE)
SWIGLU_OAI_LIMIT = F32(7.0)


def rope_inv_freq(head_dim: int, base: float) -> np.ndarray:
    """ggml's NEOX frequencies: powers of powf(base, -2/Dh) by repeated f32 product. [Dh/2]"""
    scale = F32(base) ** F32(-2.0 / head_dim)
    inv = np.empty(head_dim // 2, F32)
    acc = F32(1.0)
    for i in range(head_dim // 2):
        inv[i] = acc
        acc = F32(acc * scale)
    return inv


def _corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> F32:
    num = F32(n_dims) * np.log(F32(n_ctx_orig) / (F32(n_rot) * F32(2) * F32(np.pi)))
    return F32(num / (F32(2) * np.log(F32(base))))


@dataclass(frozen=True)
class RopeTable:
    """theta(pos) = pos * inv, then scaled: theta * (fs * (1 - ramp) + ramp); cos/sin * mscale.
    Without scaling fs = 1, ramp = 0, mscale = 1: plain NEOX."""

    inv: np.ndarray  # [Dh/2] float32
    fs: F32  # freq_scale = 1 / factor (1: none)
    ramp: np.ndarray | None  # [Dh/2] float32 YaRN's extrapolation share (None: linear or none)
    mscale: F32

    def cos_sin(self, pos0: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [T, Dh/2] float32 at positions pos0..pos0+T-1."""
        return self.cos_sin_at(np.arange(pos0, pos0 + t))

    def cos_sin_at(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [T, Dh/2] float32 at positions pos [T] (any order)."""
        extrap = np.asarray(pos, dtype=F32)[:, None] * self.inv[None, :]  # [T, Dh/2]
        theta = extrap
        if self.fs != 1:
            theta = (self.fs * extrap).astype(F32)
            if self.ramp is not None:
                theta = (theta * (F32(1) - self.ramp) + extrap * self.ramp).astype(F32)
        cos, sin = np.cos(theta), np.sin(theta)
        if self.mscale != 1:
            cos, sin = cos * self.mscale, sin * self.mscale
        return cos, sin


def rope_table(a) -> RopeTable:
    """The angles of model args `a` (ModelArgs: rope_theta, the rotated dims `rope_dims` (the
    head dim, or qwen3next's partial n_rot) and the RoPE scaling fields), as llama.cpp's context
    and ggml's rope_yarn derive them."""
    inv = rope_inv_freq(a.rope_dims, a.rope_theta)
    kind = getattr(a, "rope_scaling", "none")
    if kind == "none":
        return RopeTable(inv, F32(1), None, F32(1))
    fs = F32(1) / F32(a.rope_factor)
    attn = F32(a.rope_attn_factor)
    if kind != "yarn":
        return RopeTable(inv, fs, None, attn)
    factor = F32(1) / fs  # llama_context's yarn_attn_factor, cancelled against rope_yarn's
    m = F32(F32(0.1) * np.log(factor) + F32(1)) if factor > 1 else F32(1)
    attn = F32(F32(m * (F32(1) / (F32(1) + F32(0.1) * np.log(factor)))) * attn)
    dh, orig = a.rope_dims, a.rope_orig_ctx or a.n_ctx_train
    lo = F32(max(0.0, np.floor(_corr_dim(dh, orig, a.yarn_beta_fast, a.rope_theta))))
    hi = F32(min(dh - 1.0, np.ceil(_corr_dim(dh, orig, a.yarn_beta_slow, a.rope_theta))))
    y = ((np.arange(dh // 2, dtype=F32) - lo) / max(F32(0.001), F32(hi - lo))).astype(F32)
    ramp = (F32(1) - np.minimum(F32(1), np.maximum(F32(0), y))).astype(F32)
    mscale = F32(attn * F32(F32(1) + F32(0.1) * np.log(F32(1) / fs)))
    return RopeTable(inv, fs, ramp, mscale)


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """min(gate, 7) * sigmoid(1.702 min(gate, 7)) * (clip(up, -7, 7) + 1), float32."""
    x = np.minimum(gate, SWIGLU_OAI_LIMIT)
    y = np.clip(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    return x / (F32(1) + np.exp(SWIGLU_OAI_ALPHA * -x)) * (y + F32(1))
