"""Float64 NumPy reference forward pass of qwen3moe / qwen2moe / gpt-oss: the oracle the engine is
held to (gpt-oss's own pieces: ref_gpt_oss.py).

Readable on purpose: the whole sequence at once, causal attention without a KV cache, every
weight dequantized through `gguf.quants`. Two numerics:
  exact  - float64 throughout;
  llama  - copies llama.cpp CPU's roundings: each matmul's activation goes through the weight's
           vec_dot type (Q8_0 / Q8_K round trip, f16, bf16), q/K/V through f16 (its f16 KV cache),
           the softmax probabilities through f16 before they meet V. Where f32 noise would flip
           those f16 roundings it copies the float32 arithmetic too: RMS norms as ggml computes
           them, the residual stream in float32, and the dense F16/BF16/F32 matmuls summed in
           ggml's order (`ggml_dot`). Logits then agree with llama.cpp to ~1e-5 relative.
Shape letters: see strata/model/args.py (T, D, H, G, Dh, E, K, F, V).
"""

from __future__ import annotations

from functools import cache

import numpy as np
from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import GGMLQuantizationType

from strata.model import ref_gpt_oss as oss
from strata.model.loader import Model
from strata.model.reference_hybrid import forward_hybrid
from strata.quant import fmt
from strata.quant.activation import roundtrip
from strata.quant.dequant import dequant

QT = GGMLQuantizationType
MIN_WEIGHT_SUM = 6.103515625e-5  # llama.cpp clamps the top-k weight sum below at this (2^-14)
FLOAT_DOT = (QT.F16, QT.BF16, QT.F32)  # weights ggml-cpu multiplies in float32 arithmetic


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float32).astype(np.float64)


def _fma_lanes(x: np.ndarray, w: np.ndarray, width: int) -> np.ndarray:
    """`width` float32 accumulators per output, lane l summing k = l (mod width) by fused
    multiply-add in k order. x [T, K], w [N, K] -> [T, N, width] float32. The product of two
    float32 values is exact in float64, so each step rounds once, as FMA does (up to a double
    rounding when the float64 sum itself rounds, rare enough to ignore)."""
    t, k = x.shape
    xs = x.astype(np.float64).reshape(t, 1, k // width, width)
    ws = w.astype(np.float64).reshape(1, w.shape[0], k // width, width)
    acc = np.zeros((t, w.shape[0], width), np.float32)
    for j in range(k // width):
        acc = (acc + xs[:, :, j] * ws[:, :, j]).astype(np.float32)
    return acc


def _fold_halves(a: np.ndarray) -> np.ndarray:
    """Horizontal float32 sum by adding the upper half onto the lower until one lane is left
    (tinyBLAS's hsum; GCC's _mm512_reduce_add_ps). [..., 2^n] -> [...]"""
    while a.shape[-1] > 1:
        h = a.shape[-1] // 2
        a = a[..., :h] + a[..., h:]
    return a[..., 0]


def ggml_dot(x: np.ndarray, w: np.ndarray, wtype: QT, lanes: int = 8) -> np.ndarray | None:
    """x [T, K] (already rounded to the weight's vec_dot type) @ w [N, K].T as ggml-cpu sums a
    F16/BF16/F32 matmul on x86 with FMA (`lanes` = 8 for AVX2, 16 for AVX-512), float32 [T, N];
    None where its order is not modelled (the caller then sums in float64).

    T >= 2: llamafile's tinyBLAS (llamafile_sgemm), one `lanes`-wide FMA accumulator per output,
    folded in halves. T == 1: ggml's gemv path, ggml_vec_dot_f16/_f32: four accumulators over
    k in steps of 4*lanes, combined as (a0+a2)+(a1+a3), then the lanes reduced (AVX2: halves to 4
    lanes, then two hadds; AVX-512: halves). Bit-exact against llama.cpp's own tensors on AVX2
    for F16/BF16/F32 at T >= 2 and F16/F32 at T == 1 (ggml_vec_dot_bf16 is another order);
    the AVX-512 order is read from the source, not checked on a machine."""
    t, k = x.shape
    if w.shape[0] % 4 or k % (4 * lanes):  # tinyBLAS declines these; not modelled
        return None
    if t >= 2:
        return _fold_halves(_fma_lanes(x, w, lanes))
    if wtype == QT.BF16:
        return None
    a = _fma_lanes(x, w, 4 * lanes).reshape(t, w.shape[0], 4, lanes)
    a = (a[:, :, 0] + a[:, :, 2]) + (a[:, :, 1] + a[:, :, 3])  # [1, N, lanes]
    if lanes == 8:
        q = a[..., :4] + a[..., 4:]
        return (q[..., 0] + q[..., 1]) + (q[..., 2] + q[..., 3])
    return _fold_halves(a)


class Reference:
    def __init__(self, model: Model, numerics: str = "llama", lanes: int = 8):
        """lanes: float32 SIMD width of the llama.cpp build copied (8: AVX2, 16: AVX-512)."""
        if numerics not in ("llama", "exact"):
            raise ValueError(f"numerics must be 'llama' or 'exact', not {numerics!r}")
        self.model, self.args, self.llama = model, model.args, numerics == "llama"
        self.lanes = lanes

    @cache  # noqa: B019 - one Reference per model in tests; the cache is the point
    def w(self, t: MT | str, layer: int | None = None) -> np.ndarray:
        return dequant(self.model.tensor(t, layer), dtype=np.float64)

    def qtype(self, t: MT | str, layer: int | None = None) -> QT:
        return self.model.tensor(t, layer).qtype

    def act(self, x: np.ndarray, wtype: QT) -> np.ndarray:
        """x as a matmul against a `wtype` weight sees it."""
        if not self.llama:
            return x
        return roundtrip(x.astype(np.float32), fmt(wtype).vec_dot).astype(np.float64)

    def matmul(self, x: np.ndarray, t: MT | str, layer: int | None = None) -> np.ndarray:
        wtype, w = self.qtype(t, layer), self.w(t, layer)
        xa = self.act(x, wtype)  # [T, in]
        if self.llama and wtype in FLOAT_DOT and xa.ndim == 2:
            # f32 sums' noise (~1e-7) flips the f16 roundings downstream: copy ggml's order
            y = ggml_dot(xa, w, wtype, self.lanes)
            if y is not None:
                return y.astype(np.float64)
        return xa @ w.T  # [T, in] @ [in, out]

    def rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        if self.llama:  # ggml: sum of f32 squares in double, in order; the rest in f32
            x32 = np.asarray(x, np.float32)
            sq = (x32 * x32).astype(np.float64)
            mean = (np.cumsum(sq, axis=-1)[..., -1:] / x.shape[-1]).astype(np.float32)
            scale = np.float32(1) / np.sqrt(mean + np.float32(self.args.rms_eps))
            return (x32 * scale * np.asarray(weight, np.float32)).astype(np.float64)
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.args.rms_eps) * weight

    def residual(self, x: np.ndarray) -> np.ndarray:
        """The residual stream as llama.cpp keeps it: float32."""
        return _f32(x) if self.llama else x

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """NEOX RoPE: rotate pairs (i, i + Dh/2). x [T, heads, Dh], pos [T]."""
        dh = x.shape[-1]
        half = dh // 2
        mscale = 1.0
        if self.args.rope_scaling != "none":  # linear or YaRN (gpt-oss)
            theta, mscale = oss.rope_angles(self.args, pos, self.llama)
        elif self.llama:
            # ggml: theta_scale = powf(base, -2/n_dims) in f32, powers by repeated product
            scale = np.float32(self.args.rope_theta) ** np.float32(-2.0 / dh)
            inv = np.empty(half, np.float32)
            acc = np.float32(1.0)
            for i in range(half):
                inv[i] = acc
                acc = np.float32(acc * scale)
            theta = (pos[:, None].astype(np.float32) * inv[None, :]).astype(np.float64)
        else:
            inv = self.args.rope_theta ** (-np.arange(half) * 2.0 / dh)
            theta = pos[:, None] * inv[None, :]
        cos, sin = np.cos(theta), np.sin(theta)  # [T, Dh/2]
        if mscale != 1.0:  # ggml's cache holds cosf(theta) * mscale in float32
            cos, sin = cos * mscale, sin * mscale
            if self.llama:
                cos, sin = _f32(cos), _f32(sin)
        cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, Dh/2]
        x0, x1 = x[..., :half], x[..., half:]
        return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)

    def attention(self, i: int, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        a = self.args
        t = x.shape[0]
        h = self.rms_norm(x, self.w(MT.ATTN_NORM, i))  # [T, D]
        q = self.matmul(h, MT.ATTN_Q, i)  # [T, H*Dh]
        k = self.matmul(h, MT.ATTN_K, i)  # [T, G*Dh]
        v = self.matmul(h, MT.ATTN_V, i)  # [T, G*Dh]
        if a.qkv_bias:
            q = q + self.w(f"blk.{i}.attn_q.bias")
            k = k + self.w(f"blk.{i}.attn_k.bias")
            v = v + self.w(f"blk.{i}.attn_v.bias")
        q = q.reshape(t, a.n_head, a.head_dim)  # [T, H, Dh]
        k = k.reshape(t, a.n_head_kv, a.head_dim)  # [T, G, Dh]
        v = v.reshape(t, a.n_head_kv, a.v_head_dim)  # [T, G, Dh]
        if a.qk_norm:
            q = self.rms_norm(q, self.w(MT.ATTN_Q_NORM, i))
            k = self.rms_norm(k, self.w(MT.ATTN_K_NORM, i))
        q, k = self.rope(q, pos), self.rope(k, pos)
        if self.llama:  # f16 KV cache; q meets f16 K as f16
            q, k, v = _f16(q), _f16(k), _f16(v)
        rep = a.n_head // a.n_head_kv
        k = np.repeat(k, rep, axis=1)  # [T, H, Dh]
        v = np.repeat(v, rep, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(a.head_dim)  # [H, T, S]
        causal = oss.visible(t, 0, t, a.window(i))  # [T, S]: a sliding layer's window too
        scores = np.where(causal[None], scores, -np.inf)
        sinks = self.w(MT.ATTN_SINKS, i) if a.attn_sinks else None  # [H]
        p = oss.softmax_with_sinks(scores, sinks)
        if self.llama:
            p = _f16(p)
        o = np.einsum("hts,shd->thd", p, v).reshape(t, -1)  # [T, H*Dh]
        out = self.matmul(o, MT.ATTN_OUT, i)  # [T, D]
        if a.o_bias:
            out = self.bias_add(out, f"blk.{i}.attn_output.bias")
        return self.residual(x + out)

    def bias_add(self, y: np.ndarray, tname: str) -> np.ndarray:
        """y + a bias, rounded to float32 as ggml's add leaves it (llama numerics)."""
        y = y + self.w(tname)
        return _f32(y) if self.llama else y

    def router_logits(self, i: int, h: np.ndarray) -> np.ndarray:
        logits = self.matmul(h, MT.FFN_GATE_INP, i)  # [T, E]
        if self.args.router_bias:
            logits = self.bias_add(logits, f"blk.{i}.ffn_gate_inp.bias")
        return logits

    def route(self, i: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Router: softmax over all E, top-K, renormalized (qwen3moe); gpt-oss: top-K of the
        logits, a softmax over those K. ids/weights [T, K]."""
        logits = self.router_logits(i, h)  # [T, E]
        if self.args.gating == "softmax_weight":
            return oss.softmax_weight_topk(logits, self.args.n_expert_used)
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        ids = np.argsort(-p, axis=-1, kind="stable")[:, : self.args.n_expert_used]  # [T, K]
        wts = np.take_along_axis(p, ids, axis=-1)  # [T, K]
        if self.args.norm_topk:
            wts = wts / np.maximum(wts.sum(axis=-1, keepdims=True), MIN_WEIGHT_SUM)
        return ids, wts

    def expert(self, i: int, e: int, h: np.ndarray) -> np.ndarray:
        """One SwiGLU expert on rows h [n, D] -> [n, D] (gpt-oss: biases, clamped SwiGLU)."""
        a = self.args
        gate = self.act(h, self.qtype(MT.FFN_GATE_EXP, i)) @ self.w(MT.FFN_GATE_EXP, i)[e].T
        up = self.act(h, self.qtype(MT.FFN_UP_EXP, i)) @ self.w(MT.FFN_UP_EXP, i)[e].T  # [n, F]
        if a.expert_bias:
            gate = self.expert_bias_add(gate, f"blk.{i}.ffn_gate_exps.bias", e)
            up = self.expert_bias_add(up, f"blk.{i}.ffn_up_exps.bias", e)
        if a.ffn_act == "swiglu_oai":
            act = oss.swiglu_oai(gate, up, self.llama)
        else:
            act = gate / (1.0 + np.exp(-gate)) * up
        y = self.act(act, self.qtype(MT.FFN_DOWN_EXP, i)) @ self.w(MT.FFN_DOWN_EXP, i)[e].T
        if a.expert_bias:
            y = self.expert_bias_add(y, f"blk.{i}.ffn_down_exps.bias", e)
        return y

    def expert_bias_add(self, y: np.ndarray, tname: str, e: int) -> np.ndarray:
        """y + expert e's row of a stacked bias [E, ...] (float32 in llama numerics)."""
        y = (_f32(y) if self.llama else y) + self.w(tname)[e]
        return _f32(y) if self.llama else y

    def router_margin(self, i: int, h: np.ndarray) -> np.ndarray:
        """Per token, the router-logit gap between the K-th pick and the best expert left out
        [T]: how close the top-K choice is to a tie."""
        logits = np.sort(self.router_logits(i, h), axis=-1)[:, ::-1]  # [T, E]
        k = self.args.n_expert_used
        return logits[:, k - 1] - logits[:, k]

    def moe(
        self, i: int, x: np.ndarray, record: list | None = None, margins: list | None = None
    ) -> np.ndarray:
        h = self.rms_norm(x, self.w(MT.FFN_NORM, i))  # [T, D]
        ids, wts = self.route(i, h)
        if record is not None:
            record.append(ids)
        if margins is not None:
            margins.append(self.router_margin(i, h))
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            for k in range(ids.shape[1]):
                out[t] += wts[t, k] * self.expert(i, int(ids[t, k]), h[t : t + 1])[0]
        if self.args.shared_ff:
            sh_gate = self.matmul(h, MT.FFN_GATE_SHEXP, i)
            sh_up = self.matmul(h, MT.FFN_UP_SHEXP, i)
            sh = self.matmul(sh_gate / (1.0 + np.exp(-sh_gate)) * sh_up, MT.FFN_DOWN_SHEXP, i)
            g = h @ self.w(MT.FFN_GATE_INP_SHEXP, i)  # [T]
            out += sh * (1.0 / (1.0 + np.exp(-g)))[:, None]
        return self.residual(x + out)

    def forward(
        self, tokens, record: list | None = None, margins: list | None = None
    ) -> np.ndarray:
        """Logits [T, V] for every position of `tokens`. Per layer, `record` collects the router's
        ids [T, K] and `margins` its top-K tie margins [T]."""
        if self.args.linear_attn:  # qwen3next: DeltaNet and gated attention layers
            return forward_hybrid(self, tokens, record, margins)
        ids = np.asarray(tokens, dtype=np.int64)
        x = self.w(MT.TOKEN_EMBD)[ids]  # [T, D]
        pos = np.arange(len(ids), dtype=np.float64)
        for i in range(self.args.n_layer):
            x = self.attention(i, x, pos)
            x = self.moe(i, x, record, margins)
        x = self.rms_norm(x, self.w(MT.OUTPUT_NORM))
        return self.matmul(x, MT.OUTPUT)  # [T, V]
