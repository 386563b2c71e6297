"""`CupyTier`: the DeviceTier interface (strata/gpu/tier.py) on the card, with CuPy RawKernels.

Numerics copy HostTier's (and so llama.cpp's): activations are quantized on the device to each
weight's vec_dot type exactly as strata.quant.activation does, the KV cache is f16 (or, with
kv_type="int8", int8 rows with a float32 scale each, rounded as HostTier's int8 cache), q meets
it as f16 and the softmax probabilities are rounded to f16. What differs is float32 summation
order, so logits agree with HostTier to ~1e-5 relative except where a Q8 rounding flips.

Arrays at the boundary: `embed` returns a device (CuPy) array; every other method accepts NumPy
or CuPy and returns the same kind it was given, so the engine's x stays on the card between
calls. Router logits always come back as NumPy (routing runs on the host: the one read-back of
a layer), or, from `router_picks` (a prompt's top-k on the card), the picks; `output` returns
NumPy logits. `router`'s h is a view of a tier buffer, valid until the next `router` call
(passing it back to `experts` reuses its Q8 form).

A prompt runs in chunks of `ptmax` rows (the grouped experts' chunk, 512): its attention
projections, RoPE and router take a chunk at once (on CUDA sm_80+ the quantized projections on
the int8 tensor cores, `gemv.gemm_mma`, and the attention over the f16 cache on the f16 ones,
`attention.attention_mma`; elsewhere the T-row GEMV and attention.cu's kernels over query
chunks of `att_tmax`, its scores workspace).

Memory: dense weights, the KV cache, the workspace and the expert slots are reserved in the
`DeviceBudget` and allocated once; a call allocates only the arrays it returns (from CuPy's
capped pool). Experts live in fixed slots ((layer, expert) -> slot, least recently used out);
a missing expert is uploaded into a slot when it is first needed (synchronously: eager steps);
the adaptive cache's admits upload on a copy stream (`prefetch`), off the compute streams.

The class is composed by concern: the dense weights (dense.py), the workspace (workspace.py),
the expert slots and their uploads (expert_slots.py), a prompt's steps (prefill.py); the graph
decode steps are decode_graph.py's. This module holds the per-layer forward the eager steps
and the graph captures share.

T = tokens, D = hidden, H/G = query/KV heads, Dh/Dv = head dims, E = experts, K = used,
F = expert FFN, V = vocab, L = layers, S = context.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.cpu.rope import rope_table
from strata.cpu.tier import check_kv_type, rope_inv_freq
from strata.gpu.attention import (
    attention,
    attention_decode,
    attention_mma,
    attention_mma_shape_ok,
    dec_grid_for,
)
from strata.gpu.budget import DeviceBudget
from strata.gpu.decode_graph import GraphDecoder
from strata.gpu.dense import DenseWeights
from strata.gpu.device import DeviceError, DeviceInfo, import_cupy, primary_device
from strata.gpu.elementwise import sigmoid_scale_rows, silu_mul
from strata.gpu.embed import embed
from strata.gpu.expert_slots import ExpertSlots
from strata.gpu.experts import GROUPED_MIN_T, moe_experts, moe_experts_grouped
from strata.gpu.gemv import DeviceWeight, gemm_mma, gemv
from strata.gpu.norm_quant import ActBuf, norm_quant
from strata.gpu.pairs_fast import distinct_experts
from strata.gpu.prefill import PromptPath
from strata.gpu.rawmod import kernels_for
from strata.gpu.rope_kv import RopeScaling, qk_norm_rope_kv
from strata.gpu.sample import sample_logits
from strata.gpu.workspace import Workspace
from strata.model.loader import Model
from strata.quant import fmt

QT = GGMLQuantizationType


class CupyTier(DenseWeights, Workspace, ExpertSlots, PromptPath):
    name = "cupy"

    def __init__(
        self,
        model: Model,
        n_ctx: int = 4096,
        budget: DeviceBudget | None = None,
        expert_slots: int | str = "auto",
        device: DeviceInfo | None = None,
        tmax: int = 32,
        kv_type: str = "f16",
        prefill_stage: int = 0,
    ):
        cp = self.cp = import_cupy()
        info = device or primary_device()
        if cp is None or info is None:
            raise DeviceError("no GPU: CupyTier needs CuPy and a device (use the host tier)")
        self.info = info
        self.K = kernels_for(info)
        # a prompt's resident experts and quantized projections on the int8 tensor cores where
        # the card has them (elsewhere the dp4a tile kernels and gemv_*)
        self.moe_mma = self.K.int8_mma
        self.budget = budget if budget is not None else DeviceBudget()
        self.budget.install_pool_cap(cp)
        a = self.args = model.args
        # gpt-oss's experts (biases, the clamped SwiGLU) on the dp4a kernels only
        self.oai = a.ffn_act == "swiglu_oai"
        self.exp_mma = self.moe_mma and not (self.oai or a.expert_bias)
        self.model, self.n_ctx, self.tmax = model, int(n_ctx), int(tmax)
        self.eps = float(np.float32(a.rms_eps))
        self.dims = (a.n_head, a.n_head_kv, a.head_dim, a.v_head_dim)
        self.qkv_dim = (a.n_head + a.n_head_kv) * a.head_dim + a.n_head_kv * a.v_head_dim
        self.scale = float(np.float32(1.0 / np.sqrt(a.head_dim)))

        self.budget.reserve("weights", self._dense_bytes())
        self._load_dense()
        # KV cache [L, G, S, Dh]: f16 bits, or int8 with a float32 scale per row [L, G, S]
        self.kv_type = check_kv_type(kv_type)
        # a prompt's attention over the f16 cache on the f16 tensor cores where the card has
        # them (elsewhere attention.cu's kernels, which alone have sinks and sliding windows)
        self.attn_mma = (
            self.K.int8_mma
            and self.kv_type == "f16"
            and attention_mma_shape_ok(self.dims)
            and not (a.attn_sinks or any(a.swa_layers))
        )
        kv_shape = (a.n_layer, a.n_head_kv, self.n_ctx)
        self.budget.reserve("kv", model.kv_bytes(self.n_ctx, self.kv_type))
        kv = np.int8 if self.kv_type == "int8" else np.uint16
        self.k_cache = cp.zeros((*kv_shape, a.head_dim), kv)
        self.v_cache = cp.zeros((*kv_shape, a.v_head_dim), kv)
        self.k_scale = self.v_scale = None
        if self.kv_type == "int8":
            self.k_scale = cp.zeros(kv_shape, np.float32)
            self.v_scale = cp.zeros(kv_shape, np.float32)
        self.inv_freq = cp.asarray(rope_inv_freq(a.head_dim, a.rope_theta))
        self.rope_scaling = RopeScaling.of(cp, rope_table(a))  # gpt-oss: YaRN
        self._alloc_workspace()
        self._init_stage(prefill_stage)
        self._init_slots(expert_slots)

    def graph_decoder(self) -> GraphDecoder:
        """The CUDA-graph decode steps of this tier (built on first use)."""
        if self._graph is None:
            self._graph = GraphDecoder(self)
        return self._graph

    def routes_on_device(self) -> bool:
        """Whether the graph step can route (top-k + CAR) on this card for this model."""
        from strata.gpu.route_car import route_car_supported

        a = self.args  # route_car's CAR: a softmax over all E logits, then top-k (not gpt-oss's)
        return a.gating == "softmax" and route_car_supported(self.K, a.n_expert, a.n_expert_used)

    # the engine's host-side helpers: the CPU pool reads h on the host and returns host rows
    def to_host(self, a) -> np.ndarray:
        return self.cp.asnumpy(a) if isinstance(a, self.cp.ndarray) else np.asarray(a)

    def to_device(self, a):
        return a if isinstance(a, self.cp.ndarray) else self.cp.asarray(a)

    # ---- boundary ----
    def _in(self, x) -> tuple[object, bool]:
        cp = self.cp
        if isinstance(x, cp.ndarray):
            return cp.ascontiguousarray(x, dtype=np.float32), False
        return cp.asarray(np.ascontiguousarray(x, dtype=np.float32)), True

    def _out(self, y, to_host: bool):
        return self.cp.asnumpy(y) if to_host else y

    def _chunks(self, t: int, size: int | None = None):
        size = size or self.tmax
        for c0 in range(0, t, size):
            yield c0, min(size, t - c0)

    # ---- the DeviceTier interface ----
    def embed(self, ids: np.ndarray):
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        x = self.cp.empty((ids.size, self.args.n_embd), np.float32)
        for c0, n in self._chunks(ids.size):
            self.ids_buf[:n].set(ids[c0 : c0 + n])
            embed(self.K, self.embd, self.ids_buf, n, x[c0 : c0 + n])
        return x

    def attention(self, layer: int, x, pos0: int):
        xd, host = self._in(x)
        t = xd.shape[0]
        if pos0 + t > self.n_ctx:
            raise ValueError(f"context is full: {pos0 + t} tokens > n_ctx {self.n_ctx}")
        out = self.cp.empty_like(xd)
        for c0, n in self._chunks(t, self.ptmax):
            self._attention(layer, xd[c0 : c0 + n], pos0 + c0, out[c0 : c0 + n], n)
        return self._out(out, host)

    def _attention(self, layer: int, x, pos0: int, out, t: int, pos_dev=None) -> None:
        """out[:t] = x + attention(x) at positions pos0.. (t <= ptmax; decode, t = 1: the
        position is read from pos_dev [1] int32 on the device, so the launches can be replayed
        from a graph). The projections and RoPE take all t rows at once; so does attention_mma
        (the f16 tensor cores), while attention.cu's kernels take query chunks of att_tmax rows
        (their scores workspace), each against the keys up to it."""
        K, L, a = self.K, self.layers[layer], self.args
        if t == 1 and pos_dev is None:  # eager decode: the same kernels as the graph step
            pos_dev = self.pos_buf
            pos_dev.set(np.array([pos0], np.int32))
            # and the decode attention the graph step picks for this position (GraphDecoder's
            # _begin): the short kernel's sums are its own, so eager and replayed steps agree
            # bit for bit only if both take it at the same positions
            self.attn_ws.dec_nsplit = dec_grid_for(self.attn_ws, pos0)
        act = self.act(a.n_embd, L.qkv[0][0].vec_dot)
        norm_quant(K, x, t, L.attn_norm, self.eps, act=act)
        flat = self.qkv_buf.reshape(-1)
        for w, off in L.qkv:
            wa = self.act(a.n_embd, w.vec_dot)
            if wa is not act:
                norm_quant(K, x, t, L.attn_norm, self.eps, act=wa)
            self._gemv(w, wa, flat[off:], t, ldo=self.qkv_dim)
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        ks = vs = None  # the int8 cache's row scales [G, S]
        if self.k_scale is not None:
            ks, vs = self.k_scale[layer], self.v_scale[layer]
        qk_norm_rope_kv(
            K,
            self.qkv_buf,
            t,
            self.dims,
            L.q_norm,
            L.k_norm,
            self.eps,
            self.inv_freq,
            pos0,
            self.q_buf,
            kc,
            vc,
            pos_dev=pos_dev,
            k_scale=ks,
            v_scale=vs,
            scaling=self.rope_scaling,
        )
        win = a.window(layer)  # a sliding layer's (gpt-oss), else 0
        if pos_dev is not None:
            attention_decode(
                K, self.attn_ws, self.q_buf, kc, vc, pos_dev, self.dims, self.scale, self.o_buf,
                ks, vs, win, L.sinks,
            )  # fmt: skip
        elif self.attn_mma:  # one launch for the chunk's rows (no scores workspace)
            attention_mma(K, self.q_buf, kc, vc, t, pos0, self.dims, self.scale, self.o_buf)
        else:
            for c0, n in self._chunks(t, self.att_tmax):
                attention(
                    K, self.attn_ws, self.q_buf[c0 : c0 + n], kc, vc, n, pos0 + c0, self.dims,
                    self.scale, self.o_buf[c0 : c0 + n], ks, vs, win, L.sinks,
                )  # fmt: skip
        oact = self.act(self.o_buf.shape[1], L.o.vec_dot)
        norm_quant(K, self.o_buf, t, act=oact)
        self._gemv(L.o, oact, out, t, resid=x)

    def router(self, layer: int, x):
        h, lg = self._router_chunks(layer, x, picks=False)
        return h, self.cp.asnumpy(lg)  # one read-back a layer: chunks queue without waiting

    def _router_into(self, layer: int, x, h, t: int, out=None) -> None:
        """h[:t] = ffn_norm(x) (also quantized for the experts), out[:t] (default rlogits_buf) =
        router(h)."""
        L, a = self.layers[layer], self.args
        eact = self.act(a.n_embd, fmt(L.exp_qt[0]).vec_dot)
        norm_quant(self.K, x, t, L.ffn_norm, self.eps, out_f=h, act=eact)
        self._linear(L.router, h, t, self.rlogits_buf if out is None else out)

    def _gemv(self, w: DeviceWeight, act: ActBuf, out, t: int, resid=None, ldo=None) -> None:
        """gemv, a prompt chunk of quantized weights on the int8 tensor cores where the card has
        them (gemm_mma: the decode step's T = 1 keeps gemv's kernels)."""
        if t > GROUPED_MIN_T and self.moe_mma and w.quantized:
            gemm_mma(self.K, w, act, out, t, resid=resid, ldo=ldo)
        else:
            gemv(self.K, w, act, out, t, resid=resid, ldo=ldo)

    def _linear(self, w: DeviceWeight, x, t: int, out, resid=None) -> None:
        """out[:t] = HostTier's _Linear(w)(x[:t]): quantize x for w, then the GEMV."""
        if w.qtype == QT.F32:
            gemv(self.K, w, x, out, t, resid=resid)  # F32: the activation is used as is
            return
        act = self.act(int(x.shape[-1]), w.vec_dot)
        norm_quant(self.K, x, t, act=act)
        self._gemv(w, act, out, t, resid=resid)

    def experts(self, layer: int, h, ids: np.ndarray, weights: np.ndarray):
        hd, host = self._in(h)
        ids = np.asarray(ids)
        w = np.ascontiguousarray(weights, dtype=np.float32)
        need = distinct_experts(ids, self.args.n_expert)
        out = self.cp.empty((hd.shape[0], self.args.n_embd), np.float32)
        if need.size <= self.n_slots:
            self._experts(layer, hd, h, self.slots_for(layer, ids), w, out, ids=ids)
        else:  # more distinct experts than slots (a long prefill, a tiny cache): in passes
            cached, tmp = self._last_h, self.cp.empty_like(out)
            out[...] = 0
            for grp in np.array_split(need, -(-need.size // self.n_slots)):
                sel = np.where(np.isin(ids, grp), ids, -1)
                self._last_h = cached
                self._experts(layer, hd, h, self.slots_for(layer, sel), w, tmp, ids=sel)
                out += tmp
        self._last_h = None
        return self._out(out, host)

    def _experts(
        self, layer: int, hd, h, slots: np.ndarray, w: np.ndarray, out, stores=None, ids=None
    ) -> None:
        """out = the experts of `slots` [T, K] (in `stores`, default the cache's) on h; ids
        [T, K]: their experts (gpt-oss: whose biases the kernels add)."""
        t, k = slots.shape
        a, L = self.args, self.layers[layer]
        hact = self.act(a.n_embd, fmt(L.exp_qt[0]).vec_dot)
        cached = self._last_h is not None and self._last_h[1] == layer and self._last_h[0] is h
        self.await_uploads()
        if t > GROUPED_MIN_T:  # a prompt: the pairs grouped by expert, chunks of moe_tmax
            gh = self.acts[(a.n_embd, int(fmt(L.exp_qt[0]).vec_dot), "moe_h")]
            aact = self.acts[(a.expert_ff, int(fmt(L.exp_qt[2]).vec_dot), "moe")]
            for c0, n in self._chunks(t, self.moe_tmax):
                norm_quant(self.K, hd[c0 : c0 + n], n, act=gh)
                sl = slots[c0 : c0 + n]
                self.pair_slot[: n * k].set(sl.reshape(-1))
                self.pair_w[: n * k].set(w[c0 : c0 + n].reshape(-1))
                self._set_pair_exp(L, ids, c0, n)
                moe_experts_grouped(
                    self.K,
                    L.exp_qt,
                    (a.n_embd, a.expert_ff),
                    stores or self.stores,
                    gh,
                    sl,
                    self.pair_slot,
                    self.pair_w,
                    self.tiles,
                    self.moe_act,
                    aact,
                    out[c0 : c0 + n],
                    mma=self.exp_mma,
                    bias=L.exp_bias,
                    pair_exp=self.pair_exp,
                    oai=self.oai,
                )
            return
        for c0, n in self._chunks(t):
            if not (cached and c0 == 0 and n == t):
                norm_quant(self.K, hd[c0 : c0 + n], n, act=hact)
            self.pair_slot[: n * k].set(slots[c0 : c0 + n].reshape(-1))
            self.pair_w[: n * k].set(w[c0 : c0 + n].reshape(-1))
            self._set_pair_exp(L, ids, c0, n)
            self._moe_pairs(layer, n, k, out[c0 : c0 + n], stores)

    def _set_pair_exp(self, L, ids, c0: int, n: int) -> None:
        """pair_exp = the experts of rows c0..c0+n of ids [T, K], where the layer has biases."""
        if L.exp_bias is not None:
            k = ids.shape[1]
            self.pair_exp[: n * k].set(np.maximum(ids[c0 : c0 + n], 0).astype(np.int32).ravel())

    def _moe_pairs(
        self, layer: int, t: int, k: int, out, stores=None, resid=None, pair_exp=None
    ) -> None:
        """out[:t] = the experts of pair_slot/pair_w [t*k] on h, quantized in its ActBuf
        (slots of `stores`, default the cache's), + resid[:t] where given; pair_exp [t*k]:
        the pairs' experts (gpt-oss's biases), default the tier's pair_exp."""
        a, L = self.args, self.layers[layer]
        moe_experts(
            self.K,
            L.exp_qt,
            (a.n_embd, a.expert_ff),
            stores or self.stores,
            self.act(a.n_embd, fmt(L.exp_qt[0]).vec_dot),
            self.pair_slot,
            self.pair_w,
            t,
            k,
            self.moe_act,
            self.acts[(a.expert_ff, int(fmt(L.exp_qt[2]).vec_dot), "moe")],
            out,
            resid=resid,
            bias=L.exp_bias,
            pair_exp=self.pair_exp if pair_exp is None else pair_exp,
            oai=self.oai,
        )

    def shared_expert(self, layer: int, h):
        hd, host = self._in(h)
        t = hd.shape[0]
        L, a = self.layers[layer], self.args
        out = self.cp.zeros((t, a.n_embd), np.float32)
        if L.sh is None:
            return self._out(out, host)
        for c0, n in self._chunks(t):
            self._shared_into(layer, hd[c0 : c0 + n], n, out[c0 : c0 + n])
        return self._out(out, host)

    def _shared_into(self, layer: int, hc, n: int, y) -> None:
        """y[:n] = the sigmoid-gated shared expert of h rows hc[:n] (n <= tmax)."""
        L, a = self.layers[layer], self.args
        fs = a.shared_ff
        g, u, act = self.sh_buf[0], self.sh_buf[1], self.sh_buf[2]
        self._linear(L.sh["gate"], hc, n, g)
        self._linear(L.sh["up"], hc, n, u)
        silu_mul(self.K, g, u, act, n * fs)
        self._linear(L.sh["down"], act[:n], n, y)
        gemv(self.K, L.sh["inp"], hc, self.sh_gate_buf, n)  # h @ sh_inp, unrounded h
        sigmoid_scale_rows(self.K, y, self.sh_gate_buf, n, a.n_embd)

    def output(self, x) -> np.ndarray:
        xd, _ = self._in(x)
        t = xd.shape[0]
        a = self.args
        logits = np.empty((t, a.n_vocab), np.float32)
        act = self.act(a.n_embd, self.lm_head.vec_dot)
        for c0, n in self._chunks(t):
            self._output_into(xd[c0 : c0 + n], n, act)
            logits[c0 : c0 + n] = self.cp.asnumpy(self.logits_buf[:n])
        return logits

    def output_sample(self, x, params, u: float) -> int:
        """Final norm + lm_head of the last row of x, then the sampling chain on the card with
        uniform u (strata/gpu/sample.py): only the token id comes back."""
        xd, _ = self._in(x)
        a = self.args
        self._output_into(xd[-1:], 1, self.act(a.n_embd, self.lm_head.vec_dot))
        return sample_logits(self.K, self.logits_buf, a.n_vocab, self.sample_bufs, params, u)

    def _output_into(self, x, n: int, act: ActBuf) -> None:
        """logits_buf[:n] = lm_head(output_norm(x[:n]))."""
        if self.lm_head.qtype == QT.F32:
            norm_quant(self.K, x, n, self.out_norm, self.eps, out_f=self.xn_buf)
            gemv(self.K, self.lm_head, self.xn_buf, self.logits_buf, n)
        else:
            norm_quant(self.K, x, n, self.out_norm, self.eps, act=act)
            self._gemv(self.lm_head, act, self.logits_buf, n)
