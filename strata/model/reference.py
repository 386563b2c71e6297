"""Float64 NumPy reference forward pass of qwen3moe / qwen2moe: the oracle the engine is held to.

Readable on purpose: the whole sequence at once, causal attention without a KV cache, every
weight dequantized through `gguf.quants`. Two numerics:
  exact  - float64 throughout;
  llama  - copies llama.cpp CPU's roundings: each matmul's activation goes through the weight's
           vec_dot type (Q8_0 / Q8_K round trip, f16, bf16), q/K/V through f16 (its f16 KV cache),
           the softmax probabilities through f16 before they meet V. Logits then agree with
           llama.cpp to ~1e-5 relative.
Shape letters: see strata/model/args.py (T, D, H, G, Dh, E, K, F, V).
"""

from __future__ import annotations

from functools import cache

import numpy as np
from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import GGMLQuantizationType

from strata.model.loader import Model
from strata.model.weights import dequant
from strata.quant import fmt
from strata.quant.activation import roundtrip

QT = GGMLQuantizationType
MIN_WEIGHT_SUM = 6.103515625e-5  # llama.cpp clamps the top-k weight sum below at this (2^-14)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float64)


class Reference:
    def __init__(self, model: Model, numerics: str = "llama"):
        if numerics not in ("llama", "exact"):
            raise ValueError(f"numerics must be 'llama' or 'exact', not {numerics!r}")
        self.model, self.args, self.llama = model, model.args, numerics == "llama"

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
        return self.act(x, self.qtype(t, layer)) @ self.w(t, layer).T  # [T, in] @ [in, out]

    def rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(ms + self.args.rms_eps) * weight

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """NEOX RoPE: rotate pairs (i, i + Dh/2). x [T, heads, Dh], pos [T]."""
        dh = x.shape[-1]
        half = dh // 2
        if (
            self.llama
        ):  # ggml: theta_scale = powf(base, -2/n_dims) in f32, powers by repeated product
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
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]  # [T, 1, Dh/2]
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
        causal = np.tril(np.ones((t, t), dtype=bool))
        scores = np.where(causal[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        if self.llama:
            p = _f16(p)
        o = np.einsum("hts,shd->thd", p, v).reshape(t, -1)  # [T, H*Dh]
        return x + self.matmul(o, MT.ATTN_OUT, i)

    def route(self, i: int, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Router: softmax over all E, top-K, renormalized (qwen3moe). ids/weights [T, K]."""
        logits = self.matmul(h, MT.FFN_GATE_INP, i)  # [T, E]
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        ids = np.argsort(-p, axis=-1, kind="stable")[:, : self.args.n_expert_used]  # [T, K]
        wts = np.take_along_axis(p, ids, axis=-1)  # [T, K]
        if self.args.norm_topk:
            wts = wts / np.maximum(wts.sum(axis=-1, keepdims=True), MIN_WEIGHT_SUM)
        return ids, wts

    def expert(self, i: int, e: int, h: np.ndarray) -> np.ndarray:
        """One SwiGLU expert on rows h [n, D] -> [n, D]."""
        gate = self.act(h, self.qtype(MT.FFN_GATE_EXP, i)) @ self.w(MT.FFN_GATE_EXP, i)[e].T
        up = self.act(h, self.qtype(MT.FFN_UP_EXP, i)) @ self.w(MT.FFN_UP_EXP, i)[e].T  # [n, F]
        act = gate / (1.0 + np.exp(-gate)) * up
        return self.act(act, self.qtype(MT.FFN_DOWN_EXP, i)) @ self.w(MT.FFN_DOWN_EXP, i)[e].T

    def router_margin(self, i: int, h: np.ndarray) -> np.ndarray:
        """Per token, the router-logit gap between the K-th pick and the best expert left out
        [T]: how close the top-K choice is to a tie."""
        logits = np.sort(self.matmul(h, MT.FFN_GATE_INP, i), axis=-1)[:, ::-1]  # [T, E]
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
        return x + out

    def forward(
        self, tokens, record: list | None = None, margins: list | None = None
    ) -> np.ndarray:
        """Logits [T, V] for every position of `tokens`. Per layer, `record` collects the router's
        ids [T, K] and `margins` its top-K tie margins [T]."""
        ids = np.asarray(tokens, dtype=np.int64)
        x = self.w(MT.TOKEN_EMBD)[ids]  # [T, D]
        pos = np.arange(len(ids), dtype=np.float64)
        for i in range(self.args.n_layer):
            x = self.attention(i, x, pos)
            x = self.moe(i, x, record, margins)
        x = self.rms_norm(x, self.w(MT.OUTPUT_NORM))
        return self.matmul(x, MT.OUTPUT)  # [T, V]
