"""The CPU-only tier (`HostTier`): the interface of the GPU tier, computed with NumPy in float32.

It copies llama.cpp CPU's roundings (activations through the weight's vec_dot type, an f16 KV
cache, f16 softmax probabilities), so its greedy tokens match llama.cpp's on the same file.
`kv_type="int8"` keeps the KV rows as int8 with a float32 scale per row instead
(kv.py: the rounding the GPU tier's int8 cache uses). Dense matrices run on the CPU pool's
kernels from their own bytes (`dense="quant"`, production) or dequantized to float32
(`dense="float"`, the reference the tests pin). "Resident" experts are dequantized slot copies
kept in an LRU bounded in bytes: an emulation for tests, never the CPU pool.

The model is duck-typed: `.args` (its hyper-parameters) and `.tensor(name, layer)` (objects with
`.qtype`, `.shape`, `.data`, `.nbytes`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import numpy as np
from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import GGMLQuantizationType

from strata.cpu.dense import QuantLinear, linears
from strata.cpu.half import round_f16, to_f32
from strata.cpu.kv import dequantize_kv_rows, quantize_kv_rows
from strata.cpu.quantize import roundtrip  # NumPy's bits, compiled (float32 Q8_K / Q8_0)
from strata.cpu.rope import rope_inv_freq, rope_table, swiglu_oai
from strata.cpu.sampling import sample_ref
from strata.quant import fmt
from strata.quant.dequant import dequant

QT = GGMLQuantizationType
EXPERT_MATS = (MT.FFN_GATE_EXP, MT.FFN_UP_EXP, MT.FFN_DOWN_EXP)
KV_TYPES = ("f16", "int8")  # the KV cache's element type (--kv-type)


def check_kv_type(kv_type: str) -> str:
    if kv_type not in KV_TYPES:
        raise ValueError(f"KV cache type must be one of {', '.join(KV_TYPES)}, not {kv_type!r}")
    return kv_type


# the attention's score rows of one query chunk stay under this (H x rows x keys float32)
HOST_ATTN_SCORES_BYTES = 64 << 20
DENSE_MODES = ("float", "quant")  # HostTier(dense=...): see HostTier._linear


class _Linear:
    """A dense weight dequantized once, with the activation type llama.cpp pairs it with."""

    __slots__ = ("w", "vec_dot", "bias")

    def __init__(self, model, t: MT | str, layer: int | None = None, bias: str | None = None):
        ref = model.tensor(t, layer)
        self.w = dequant(ref)  # [out, in] float32
        self.vec_dot = fmt(ref.qtype).vec_dot
        self.bias = dequant(model.tensor(bias)) if bias else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = roundtrip(x, self.vec_dot) @ self.w.T
        return y if self.bias is None else y + self.bias


class HostTier:
    name = "host"

    def __init__(
        self,
        model,
        n_ctx: int = 4096,
        expert_cache_mib: int = 2048,
        kv_type: str = "f16",
        prefill_stage: int = 0,
        dense: str = "float",
        progress: Callable[[int, int], None] | None = None,
    ):
        """progress(done, total): called with the layers loaded so far."""
        a = self.args = model.args
        self.model = model
        if dense not in DENSE_MODES:
            raise ValueError(f"dense must be one of {', '.join(DENSE_MODES)}, not {dense!r}")
        self.dense = dense
        self.n_ctx = n_ctx
        self.kv_type = check_kv_type(kv_type)
        self.stage_n = int(prefill_stage)  # experts_staged: any expert computes here
        self._slot_budget_mib = expert_cache_mib
        self.eps = np.float32(a.rms_eps)
        self.embd = model.tensor(MT.TOKEN_EMBD)
        self.layers = []
        for i in range(a.n_layer):
            self.layers.append(self._load_layer(i))
            if progress is not None:
                progress(i + 1, a.n_layer + 1)
        self.out_norm = dequant(model.tensor(MT.OUTPUT_NORM))
        self.lm_head = self._linear(MT.OUTPUT)
        if progress is not None:
            progress(a.n_layer + 1, a.n_layer + 1)
        self._init_rest(model)

    def _linear(self, t: MT | str, layer: int | None = None, bias: str | None = None):
        """A dense weight as the tier computes it: dequantized to float32 (`dense="float"`, the
        reference) or on the CPU pool's kernels from its own bytes (`"quant"`, QuantLinear)."""
        if self.dense == "float":
            return _Linear(self.model, t, layer, bias)
        ref = self.model.tensor(t, layer)
        b = dequant(self.model.tensor(bias)) if bias else None
        return QuantLinear(ref, fmt(ref.qtype).vec_dot, bias=b)

    def _load_layer(self, i: int) -> dict:
        model, a = self.model, self.args

        def bias(n: str) -> str | None:
            return f"blk.{i}.attn_{n}.bias" if a.qkv_bias else None

        o_bias = f"blk.{i}.attn_output.bias" if a.o_bias else None
        router_bias = f"blk.{i}.ffn_gate_inp.bias" if a.router_bias else None
        L = {
            "attn_norm": dequant(model.tensor(MT.ATTN_NORM, i)),
            "q": self._linear(MT.ATTN_Q, i, bias("q")),
            "k": self._linear(MT.ATTN_K, i, bias("k")),
            "v": self._linear(MT.ATTN_V, i, bias("v")),
            "o": self._linear(MT.ATTN_OUT, i, o_bias),
            "ffn_norm": dequant(model.tensor(MT.FFN_NORM, i)),
            "router": self._linear(MT.FFN_GATE_INP, i, router_bias),
        }
        if a.attn_sinks:
            L["sinks"] = dequant(model.tensor(MT.ATTN_SINKS, i))  # [H]
        if a.expert_bias:  # [E, F], [E, F], [E, D]
            L["exp_bias"] = tuple(
                dequant(model.tensor(f"blk.{i}.{m}.bias"))
                for m in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
            )
        if a.qk_norm:
            L["q_norm"] = dequant(model.tensor(MT.ATTN_Q_NORM, i))
            L["k_norm"] = dequant(model.tensor(MT.ATTN_K_NORM, i))
        if a.shared_ff:
            L["sh_gate"] = self._linear(MT.FFN_GATE_SHEXP, i)
            L["sh_up"] = self._linear(MT.FFN_UP_SHEXP, i)
            L["sh_down"] = self._linear(MT.FFN_DOWN_SHEXP, i)
            L["sh_inp"] = dequant(model.tensor(MT.FFN_GATE_INP_SHEXP, i))
        return L

    def _init_rest(self, model) -> None:
        a, n_ctx = self.args, self.n_ctx
        self.inv_freq = rope_inv_freq(a.head_dim, a.rope_theta)  # [Dh/2]
        self.rope_table = rope_table(a)  # with the model's RoPE scaling (gpt-oss: YaRN)
        # KV cache, allocated once: [L, S, G, Dh] f16, or int8 with scales [L, S, G] float32
        kv = np.int8 if self.kv_type == "int8" else np.float16
        self.k_cache = np.zeros((a.n_layer, n_ctx, a.n_head_kv, a.head_dim), kv)
        self.v_cache = np.zeros((a.n_layer, n_ctx, a.n_head_kv, a.v_head_dim), kv)
        self.k_scale = self.v_scale = None
        if self.kv_type == "int8":
            self.k_scale = np.zeros((a.n_layer, n_ctx, a.n_head_kv), np.float32)
            self.v_scale = np.zeros((a.n_layer, n_ctx, a.n_head_kv), np.float32)
        self.expert_vec_dot = [
            tuple(fmt(model.tensor(m, i).qtype).vec_dot for m in EXPERT_MATS)
            for i in range(a.n_layer)
        ]
        self._slots: OrderedDict[tuple[int, int], tuple[np.ndarray, ...]] = OrderedDict()
        self._slot_bytes = 0
        self._slot_budget = self._slot_budget_mib << 20
        self.expert_bytes_read = 0  # dequantized-slot misses, in source bytes

    # ---- small ops ----
    def rms_norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)  # ggml sums in double
        return (x * (1.0 / np.sqrt(ms + self.eps)).astype(np.float32)) * w

    def rope(self, x: np.ndarray, pos0: int) -> np.ndarray:
        """NEOX RoPE on x [T, heads, Dh] at positions pos0.."""
        return self.rope_at(x, np.arange(pos0, pos0 + x.shape[0]))

    def rope_at(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """NEOX RoPE on x [T, heads, Dh], row t at position pos[t]."""
        cos, sin = self.rope_table.cos_sin_at(pos)  # [T, Dh/2]
        cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, Dh/2]
        half = x.shape[-1] // 2
        x0, x1 = x[..., :half], x[..., half:]
        return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)

    # ---- the DeviceTier interface ----
    def embed(self, ids: np.ndarray) -> np.ndarray:
        return dequant(self.embd, np.asarray(ids, dtype=np.int64))  # [T, D]

    def attention(self, layer: int, x: np.ndarray, pos0: int) -> np.ndarray:
        t = x.shape[0]
        if pos0 + t > self.n_ctx:
            raise ValueError(f"context is full: {pos0 + t} tokens > n_ctx {self.n_ctx}")
        q, k, v = self.qkv(layer, x, pos0)
        s = pos0 + t
        lo = self.first_key(layer, pos0)
        if self.kv_type == "int8":  # int8 rows, one scale each: quantized from float32 k, v
            self.k_cache[layer, pos0:s], self.k_scale[layer, pos0:s] = quantize_kv_rows(k)
            self.v_cache[layer, pos0:s], self.v_scale[layer, pos0:s] = quantize_kv_rows(v)
            kc = dequantize_kv_rows(self.k_cache[layer, lo:s], self.k_scale[layer, lo:s])
            vc = dequantize_kv_rows(self.v_cache[layer, lo:s], self.v_scale[layer, lo:s])
        else:
            self.k_cache[layer, pos0:s] = k
            self.v_cache[layer, pos0:s] = v
            kc = to_f32(self.k_cache[layer, lo:s])  # [S, G, Dh] (F16C: NumPy's cast is slow)
            vc = to_f32(self.v_cache[layer, lo:s])
        return self.attend(layer, x, q, kc, vc, pos0)

    def first_key(self, layer: int, pos0: int) -> int:
        """The first position any query from pos0 on sees (a sliding layer's window)."""
        window = self.args.window(layer)
        return max(0, pos0 - window + 1) if window else 0

    def qkv(self, layer: int, x: np.ndarray, pos0: int):
        """x [T, D] at positions pos0.. -> q [T, H, Dh], k [T, G, Dh], v [T, G, Dv] (normed,
        roped): the rows the KV cache keeps, wherever it keeps them (paged_kv.py)."""
        q, k, v = self.qkv_rows(layer, x)
        return self.rope(q, pos0), self.rope(k, pos0), v

    def qkv_rows(self, layer: int, x: np.ndarray):
        """`qkv` before RoPE: each row on its own (rows at any positions)."""
        a, L = self.args, self.layers[layer]
        t = x.shape[0]
        h = self.rms_norm(x, L["attn_norm"])  # [T, D]
        if self.dense == "quant":  # h quantized once, q/k/v rows one job
            q, k, v = linears([L["q"], L["k"], L["v"]], h)
        else:
            q, k, v = L["q"](h), L["k"](h), L["v"](h)
        q = q.reshape(t, a.n_head, a.head_dim)  # [T, H, Dh]
        k = k.reshape(t, a.n_head_kv, a.head_dim)  # [T, G, Dh]
        v = v.reshape(t, a.n_head_kv, a.v_head_dim)  # [T, G, Dh]
        if a.qk_norm:
            q = self.rms_norm(q, L["q_norm"])
            k = self.rms_norm(k, L["k_norm"])
        return q, k, v

    def attend(
        self, layer: int, x: np.ndarray, q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos0: int
    ) -> np.ndarray:
        """x + o(softmax(q K^T) V) for q [T, H, Dh] at positions pos0.. over the keys kc, values
        vc [S', G, Dh] float32 of positions first_key(layer, pos0)..pos0 + T - 1."""
        return x + self.layers[layer]["o"](self.attend_heads(layer, q, kc, vc, pos0))

    def attend_heads(
        self, layer: int, q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos0: int
    ) -> np.ndarray:
        """`attend` before the output projection -> o [T, H * Dv]."""
        a, L = self.args, self.layers[layer]
        t = q.shape[0]
        s = pos0 + t
        window = a.window(layer)  # a sliding layer's query sees its last `window` positions
        lo = self.first_key(layer, pos0)  # the first key any query here sees
        g, rep = a.n_head_kv, a.n_head // a.n_head_kv
        qg = round_f16(q).reshape(t, g, rep, a.head_dim).transpose(1, 2, 0, 3)  # [G, R, T, Dh]
        scale = np.float32(1 / np.sqrt(a.head_dim))
        kt, vt = kc.transpose(1, 2, 0)[:, None], vc.transpose(1, 0, 2)[:, None]  # [G, 1, ., .]
        o = np.empty((t, a.n_head * a.v_head_dim), np.float32)
        sinks = L.get("sinks")  # [H] -> [G, R, 1, 1]: in the denominator only
        sinks = None if sinks is None else sinks.reshape(g, rep, 1, 1)
        # query rows in chunks whose scores stay under HOST_ATTN_SCORES_BYTES (a long prompt
        # would otherwise hold H x T x S floats, several times over); a chunk sees the keys up
        # to its last row's position, from its first row's window on
        step = max(1, HOST_ATTN_SCORES_BYTES // (4 * a.n_head * s))
        for c0 in range(0, t, step):
            c1 = min(t, c0 + step)
            end = pos0 + c1  # keys beg..end-1 (rows from lo in kc)
            beg = max(lo, pos0 + c0 - window + 1) if window else 0
            scores = np.matmul(qg[:, :, c0:c1], kt[..., beg - lo : end - lo]) * scale
            if c1 - c0 > 1:  # a chunk's last row sees every key it holds: nothing to mask
                kp, qp = np.arange(beg, end)[None, :], (pos0 + np.arange(c0, c1))[:, None]
                mask = (kp > qp) | ((qp - kp >= window) if window else False)  # future, slid out
                np.copyto(scores, np.float32(-np.inf), where=mask)  # (no fancy-index gather)
            m = scores.max(axis=-1, keepdims=True)
            if sinks is not None:
                m = np.maximum(m, sinks)
            scores -= m
            p = np.exp(scores, out=scores)
            total = p.sum(axis=-1, keepdims=True)
            if sinks is not None:
                total += np.exp(sinks - m)
            p /= total
            p = round_f16(p)  # llama.cpp: probs meet f16 V as f16
            oc = np.matmul(p, vt[:, :, beg - lo : end - lo])  # [G, R, n, Dv]
            o[c0:c1] = oc.transpose(2, 0, 1, 3).reshape(c1 - c0, -1)
        return o

    def router(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        L = self.layers[layer]
        h = self.rms_norm(x, L["ffn_norm"])  # [T, D]
        return h, L["router"](h)  # [T, E]

    def slot(self, layer: int, e: int) -> tuple[np.ndarray, ...]:
        """(gate [F, D], up [F, D], down [D, F]) of one expert, dequantized on first use."""
        key = (layer, e)
        w = self._slots.get(key)
        if w is not None:
            self._slots.move_to_end(key)
            return w
        refs = [self.model.tensor(m, layer) for m in EXPERT_MATS]
        w = tuple(dequant(r, e) for r in refs)
        self.expert_bytes_read += sum(r.nbytes // self.args.n_expert for r in refs)
        nbytes = sum(m.nbytes for m in w)
        while self._slots and self._slot_bytes + nbytes > self._slot_budget:
            _, old = self._slots.popitem(last=False)
            self._slot_bytes -= sum(m.nbytes for m in old)
        self._slots[key] = w
        self._slot_bytes += nbytes
        return w

    def experts(
        self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """Σ_k weights[t, k] · expert_{ids[t, k]}(h[t]) -> [T, D] (gpt-oss: with each expert's
        biases and the clamped SwiGLU)."""
        bias = self.layers[layer].get("exp_bias")  # ([E, F], [E, F], [E, D]) or None
        oai = self.args.ffn_act == "swiglu_oai"
        vd_gate, vd_up, vd_down = self.expert_vec_dot[layer]
        out = np.zeros_like(h)  # [T, D]
        hg = roundtrip(h, vd_gate)
        hu = hg if vd_up == vd_gate else roundtrip(h, vd_up)
        for e in np.unique(ids[ids >= 0]):
            rows, ks = np.nonzero(ids == e)  # the tokens that picked e
            gate, up, down = self.slot(layer, int(e))
            g = hg[rows] @ gate.T  # [n, F]
            u = hu[rows] @ up.T
            if bias is not None:
                g, u = g + bias[0][e], u + bias[1][e]
            act = swiglu_oai(g, u) if oai else g / (np.float32(1.0) + np.exp(-g)) * u
            y = roundtrip(act, vd_down) @ down.T  # [n, D]
            if bias is not None:
                y = y + bias[2][e]
            out[rows] += weights[rows, ks][:, None] * y
        return out

    def experts_staged(
        self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """A prompt's missed experts computed on this tier (the GPU tier uploads them to its
        staging slots first; here every expert is at hand)."""
        return self.experts(layer, h, ids, weights)

    def shared_expert(self, layer: int, h: np.ndarray) -> np.ndarray:
        L = self.layers[layer]
        if "sh_gate" not in L:
            return np.zeros_like(h)
        g = L["sh_gate"](h)
        y = L["sh_down"](g / (np.float32(1.0) + np.exp(-g)) * L["sh_up"](h))
        # each row's own sum (a matrix-vector product sums a row differently as T changes; a
        # speculative verify step must give a row the bits of a one-token step)
        gate = 1.0 / (1.0 + np.exp(-np.sum(h * L["sh_inp"], axis=-1)))  # [T]
        return y * gate[:, None].astype(np.float32)

    def output(self, x: np.ndarray) -> np.ndarray:
        return self.lm_head(self.rms_norm(x, self.out_norm))  # [T, V]

    def output_sample(self, x: np.ndarray, params, u: float) -> int:
        """The sampling chain on the last row's logits with uniform u: the GPU tier's
        `output_sample` computed with its NumPy reference (sampling.py)."""
        return sample_ref(self.output(x[-1:])[0], params, u)
