"""The CPU-only decode step: one compiled call a token, no Python per layer, no allocation.

    L = layers, D = hidden, H = query heads, G = KV heads, R = H / G, Dh = head dim,
    Dv = value head dim, S = positions in the cache, E = experts, K = picks a token, V = vocab

`HostStep` runs a T = 1 decode token of the host tier (`HostTier`, dense matrices on the pool's
kernels) with every expert in the CPU pool: for each layer the attention (RMS norm, q/k/v, q/k
norm, NEOX RoPE, f16 KV append, softmax attention, o), the router, softmax + top-k, the experts
(`_run_team`, the pool's own schedule and kernels), then the output norm, the head and the
argmax, in `_decode`. The dense matrices run as jobs of the pool's resident team (dense.py),
the attention as one split by KV group (strata/cpu/attention.py); everything else runs on the
calling thread. It lives with the engine's steps because it routes (top-k, strata.routing).

Numerics are the host tier's: the same kernels and activation quantization for every matrix,
f16 K/V rows, q and softmax probabilities rounded to f16, RoPE from NumPy's cos/sin table. Only
the float sums of the attention and of the softmaxes run in another order than NumPy/BLAS, so the
logits agree with the layer-by-layer path to float noise (tests hold the greedy tokens equal).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.attention import (
    AJ_CTX,
    AJ_DH,
    AJ_DK,
    AJ_DV,
    AJ_G,
    AJ_H,
    AJ_KC,
    AJ_KT,
    AJ_LEN,
    AJ_OUT,
    AJ_Q,
    AJ_S,
    AJ_SC,
    AJ_SCALE,
    AJ_VC,
    attn_share_address,
)
from strata.cpu.dense import (
    DENSE_SPLIT_BYTES,
    DJ_ACT,
    DJ_LEN,
    DJ_M,
    DJ_MAT,
    DJ_MAX,
    DJ_T,
    dense_share_address,
    run_job,
)
from strata.cpu.kernels.common import f16_bits, round_f16
from strata.cpu.pool.expert_pool import layer_desc
from strata.cpu.pool.team_job import _put, _run_team
from strata.cpu.quantize import alloc_act, quantize_row
from strata.cpu.team import CTL_LEN, SUPPORTED, call_job, shared_team
from strata.routing.topk import MIN_WEIGHT_SUM, _select

Q, K, V, O, ROUTER = range(5)  # mats[i, j]: layer i's dense matrices
M_ADDR, M_ROWS, M_RB, M_FN, M_ACT = range(5)  # mats[i, j, :]
M_LEN = 5
EMBED_TABLE_BYTES = 64 << 20  # a float32 embedding table up to this size is kept dequantized


@njit(cache=True, nogil=True)
def _dense(mats, j0, j1, ys, x, act, job, ctl, nt):
    """ys[j] [rows] = mats[j] (j0 <= j < j1, one input x [C]) against x, quantized once (the
    first matrix's activation type); matrices of one kernel share a job."""
    quantize_row(x, mats[j0, M_ACT], 0, *act)
    _put(job, DJ_ACT, act[0])
    _put(job, DJ_ACT + 3, act[1])
    _put(job, DJ_ACT + 6, act[2])
    _put(job, DJ_ACT + 9, act[3])
    _put(job, DJ_ACT + 12, act[4])
    j = j0
    while j < j1:
        n = 0
        while j + n < j1 and n < DJ_MAX and mats[j + n, M_FN] == mats[j, M_FN]:
            o = DJ_MAT + 4 * n
            job[o], job[o + 1], job[o + 2] = (
                mats[j + n, M_ADDR],
                mats[j + n, M_ROWS],
                mats[j + n, M_RB],
            )
            job[o + 3] = ys[j + n].ctypes.data
            n += 1
        job[DJ_M], job[DJ_T] = n, 1
        nbytes = 0
        for m in range(n):
            nbytes += job[DJ_MAT + 4 * m + 1] * job[DJ_MAT + 4 * m + 2]
        if nbytes < DENSE_SPLIT_BYTES:  # a team start would cost more than it saves
            call_job(mats[j, M_FN], 0, 1, job.ctypes.data)
        else:
            run_job(ctl, mats[j, M_FN], job, nt)
        j += n


@njit(cache=True, nogil=True)
def _rms(x, w, eps, out):
    """out = x * float32(1 / sqrt(mean(x^2) + eps)) * w (the sum in double, as ggml's)."""
    s = 0.0
    for i in range(x.shape[0]):
        s += np.float64(x[i]) * np.float64(x[i])
    r = np.float32(1.0 / np.sqrt(s / x.shape[0] + eps))
    for i in range(x.shape[0]):
        out[i] = (x[i] * r) * w[i]


@njit(cache=True, nogil=True)
def _rope(x, n, dh, c, s):
    """NEOX RoPE in place on n heads of x [n * Dh] with cos c, sin s [Dh / 2] of the position."""
    half = dh // 2
    for h in range(n):
        o = h * dh
        for j in range(half):
            x0, x1 = x[o + j], x[o + half + j]
            x[o + j] = x0 * c[j] - x1 * s[j]
            x[o + half + j] = x0 * s[j] + x1 * c[j]


@njit(cache=True, nogil=True)
def _route(lg, k, renorm, probs, ids, wts):
    """Softmax over lg [E], the top K ids (ties: lower id), their weights (renormalized)."""
    m = lg[0]
    for e in range(1, lg.shape[0]):
        m = max(m, lg[e])
    tot = np.float32(0.0)
    for e in range(lg.shape[0]):
        probs[e] = np.exp(lg[e] - m)
        tot += probs[e]
    for e in range(lg.shape[0]):
        probs[e] = probs[e] / tot
    _select(probs, k, ids)
    tot = np.float32(0.0)
    for j in range(k):
        wts[j] = probs[ids[j]]
        tot += wts[j]
    if renorm:
        tot = max(tot, MIN_WEIGHT_SUM)
        for j in range(k):
            wts[j] = wts[j] / tot


@njit(cache=True, nogil=True)
def _decode(
    x, pos, head, shape, eps, norms, qkn, out_norm, mats, hmat, kc, vc, cos, sin,
    hx, qkv, att, probs, ids, tok, wts, y, logits, act_d, act_o, hist,
    ldescs, pjob, djob, aj, afn, ctl, nt, min_tasks, chunk, pf,
):  # fmt: skip
    """One decode token at position pos from its embedding x [D] (updated in place): every
    layer, then (head) the output norm and head into logits [V]. Returns (the argmax of the
    logits or -1, the experts the pool ran)."""
    n_head, n_kv, dh, dv, k_used, renorm, n_e = (
        shape[0],
        shape[1],
        shape[2],
        shape[3],
        shape[4],
        shape[5],
        shape[6],
    )
    d = x.shape[0]
    na_all = 0
    # matrix ranges as int64, not literals: one compiled `_dense` for every call
    q0, v1, o0, o1 = np.int64(Q), np.int64(V + 1), np.int64(O), np.int64(O + 1)
    r0, r1 = np.int64(ROUTER), np.int64(ROUTER + 1)
    for i in range(kc.shape[0]):
        h = hx[0]
        _rms(x, norms[i, 0], eps, h)
        _dense(mats[i], q0, v1, qkv, h, act_d, djob, ctl, nt)
        q, k, v = qkv[Q], qkv[K], qkv[V]
        if qkn.shape[0]:
            for j in range(n_head):
                _rms(q[j * dh : (j + 1) * dh], qkn[i, 0], eps, q[j * dh : (j + 1) * dh])
            for j in range(n_kv):
                _rms(k[j * dh : (j + 1) * dh], qkn[i, 1], eps, k[j * dh : (j + 1) * dh])
        _rope(q, n_head, dh, cos[pos], sin[pos])
        _rope(k, n_kv, dh, cos[pos], sin[pos])
        for g in range(n_kv):
            for j in range(dh):
                kc[i, pos, g, j] = f16_bits(k[g * dh + j])
            for j in range(dv):
                vc[i, pos, g, j] = f16_bits(v[g * dv + j])
        for j in range(n_head * dh):
            q[j] = round_f16(q[j])
        aj[AJ_KC], aj[AJ_VC], aj[AJ_S] = kc[i].ctypes.data, vc[i].ctypes.data, pos + 1
        run_job(ctl, afn, aj, nt)
        _dense(mats[i], o0, o1, qkv, att, act_o, djob, ctl, nt)  # att: [H * Dv]
        for j in range(d):
            x[j] += qkv[O, j]
        _rms(x, norms[i, 1], eps, h)
        _dense(mats[i], r0, r1, qkv, h, act_d, djob, ctl, nt)
        _route(qkv[ROUTER, :n_e], k_used, renorm, probs, ids, wts)
        for j in range(k_used):
            hist[i, ids[j]] += 1
        na = _run_team(hx, tok, ids, wts, y, ldescs[i], pjob, ctl, nt, min_tasks, chunk, pf)
        if na < 0:
            return -1, na
        na_all += na
        for j in range(d):
            x[j] += y[0, j]
    if not head:
        return -1, na_all
    _rms(x, out_norm, eps, hx[0])
    ys = logits.reshape(1, logits.shape[0])
    _dense(hmat, np.int64(0), np.int64(1), ys, hx[0], act_d, djob, ctl, nt)
    best = 0
    for j in range(1, logits.shape[0]):
        if logits[j] > logits[best]:
            best = j
    return best, na_all


class HostStep:
    """A decode token of `tier` (a `HostTier` with dense="quant") with every expert in `runner`
    (a `PoolMissRunner`) in one compiled call. Build it with `HostStep.build`, which returns
    None where this path does not apply (see there); call `step(token, pos, head)`."""

    def __init__(self, tier, runner, hist: np.ndarray):
        a = tier.args
        self.tier, self.runner, self.pool = tier, runner, runner.pool
        self.n_ctx = tier.n_ctx
        self.n_layer = a.n_layer
        self.layers = runner.layers
        self.hist = hist  # [L, E] router picks (the engine's statistics)
        nt = self.pool.n_threads
        self.team = shared_team(nt) if nt > 1 else None
        self.ctl = self.team.ctl if self.team else np.zeros(CTL_LEN, np.int64)
        self.nt = nt if self.team else 1
        d, e, hd = a.n_embd, a.n_expert, a.n_head * a.head_dim
        self.shape = np.array(
            [a.n_head, a.n_head_kv, a.head_dim, a.v_head_dim, a.n_expert_used, a.norm_topk, e],
            np.int64,
        )
        self.eps = float(np.float32(a.rms_eps))  # the host tier adds eps as a float32
        self.scale = np.float32(1 / np.sqrt(a.head_dim))
        L = tier.layers
        self.norms = np.stack([np.stack([lay["attn_norm"], lay["ffn_norm"]]) for lay in L])
        self.norms = self.norms.astype(np.float32)  # [L, 2, D]
        if a.qk_norm:
            self.qkn = np.stack([np.stack([lay["q_norm"], lay["k_norm"]]) for lay in L])
        else:
            self.qkn = np.zeros((0, 2, a.head_dim))
        self.qkn = np.ascontiguousarray(self.qkn, np.float32)  # [L, 2, Dh]
        self.out_norm = np.array(tier.out_norm, np.float32)  # [D] (writable: types as norms)
        names = ("q", "k", "v", "o", "router")
        self.mats = np.stack([[_mat(lay[n]) for n in names] for lay in L])  # [L, 5, M_LEN]
        self.hmat = _mat(tier.lm_head)[None]  # [1, M_LEN]
        self.kc = tier.k_cache.view(np.uint16)  # [L, S, G, Dh] f16 bits
        self.vc = tier.v_cache.view(np.uint16)
        pos = np.arange(self.n_ctx, dtype=np.float32)[:, None]
        theta = pos * tier.inv_freq[None, :]  # [S, Dh/2]: the host tier's RoPE angles
        self.cos, self.sin = np.cos(theta), np.sin(theta)
        width = max(hd, a.n_head_kv * a.head_dim, a.n_head_kv * a.v_head_dim, d, e)
        self.hx = np.zeros((1, d), np.float32)
        self.x = np.zeros(d, np.float32)
        self.qkv = np.zeros((5, width), np.float32)  # q, k, v, o, router logits
        self.att = np.zeros(a.n_head * a.v_head_dim, np.float32)
        rep = a.n_head // a.n_head_kv
        dk = max(a.head_dim, a.v_head_dim)
        self.sc = np.zeros((self.nt, rep, self.n_ctx), np.float32)  # a thread's scores
        self.kt = np.zeros((self.nt, dk), np.float32)  # a thread's K or V row
        self.aj = np.zeros(AJ_LEN, np.int64)
        aj = self.aj
        aj[AJ_Q], aj[AJ_OUT] = self.qkv[Q].ctypes.data, self.att.ctypes.data
        aj[AJ_SC], aj[AJ_KT] = self.sc.ctypes.data, self.kt.ctypes.data
        aj[AJ_H], aj[AJ_G], aj[AJ_DH], aj[AJ_DV] = a.n_head, a.n_head_kv, a.head_dim, a.v_head_dim
        aj[AJ_CTX], aj[AJ_DK] = self.n_ctx, dk
        aj[AJ_SCALE] = int(self.scale.view(np.uint32))
        self.afn = attn_share_address()
        self.probs = np.zeros(e, np.float32)
        k = a.n_expert_used
        self.ids = np.zeros(k, np.int32)
        self.tok = np.zeros(k, np.int32)
        self.wts = np.zeros(k, np.float32)
        self.y = np.zeros((1, d), np.float32)
        self.logits = np.zeros(tier.lm_head.m.rows, np.float32)
        self.act_d = alloc_act(1, d)
        self.act_o = alloc_act(1, a.n_head * a.v_head_dim)
        self.ldescs = np.stack([layer_desc(lw) for lw in self.layers])
        self.djob = np.zeros(DJ_LEN, np.int64)
        lw = self.layers[0]
        g, u, dn = lw.gate, lw.up, lw.down
        self._ws_key = (g.cols, g.rows, g.n_expert, (g.act, u.act, dn.act))
        self.embd = None  # the embedding table as float32 where it is small
        if a.n_vocab * d * 4 <= EMBED_TABLE_BYTES:
            self.embd = np.ascontiguousarray(tier.embed(np.arange(a.n_vocab)), np.float32)

    @classmethod
    def build(cls, tier, runner, resident: np.ndarray, hist: np.ndarray) -> HostStep | None:
        """The step, or None where it does not apply: a tier other than the host tier with
        dense matrices on the pool's kernels and an f16 KV cache, a resident expert (or a pool
        other than `PoolMissRunner` over RAM copies not all loaded), a shared expert or
        attention biases (qwen2moe), DeltaNet layers (qwen3next), gpt-oss's pieces, layers whose
        experts differ in shape or activation types, or weights that are not C-contiguous bytes."""
        from strata.cpu.dense import QuantLinear
        from strata.cpu.runner import PoolMissRunner
        from strata.cpu.tier import HostTier

        if not isinstance(tier, HostTier) or not isinstance(runner, PoolMissRunner):
            return None
        a = tier.args
        if tier.dense != "quant" or tier.kv_type != "f16" or a.shared_ff or a.qkv_bias:
            return None
        if a.linear_attn:  # DeltaNet layers: the eager host path
            return None
        if a.attn_sinks or any(a.swa_layers) or a.rope_scaling != "none" or a.expert_bias:
            return None  # gpt-oss: its pieces are not in the compiled step (eager steps run it)
        if resident.any() or (runner.source == "ram" and not runner._loaded.all()):
            return None
        if runner.pool.n_threads > 1 and not SUPPORTED:
            return None
        mats = [lay[n] for lay in tier.layers for n in ("q", "k", "v", "o", "router")]
        if not all(isinstance(m, QuantLinear) and m.bias is None for m in mats + [tier.lm_head]):
            return None
        if not all(m.m.data.flags.c_contiguous for m in mats + [tier.lm_head]):
            return None
        keys = {(lw.gate.cols, lw.gate.rows, lw.gate.n_expert) + tuple(
            m.act for m in (lw.gate, lw.up, lw.down)) for lw in runner.layers}  # fmt: skip
        if len(keys) != 1 or any(layer_desc(lw) is None for lw in runner.layers):
            return None
        return cls(tier, runner, hist)

    def _workspace(self) -> None:
        """The pool's workspaces for T = 1 and K tasks (a prompt may have cut them since)."""
        ws = self.pool._ws
        k = int(self.shape[4])
        if ws.get("key") != self._ws_key or ws["t_cap"] < 1 or ws["n_cap"] < k:
            self.pool._workspace(1, k, *self._ws_key)
            ws["ws_lw"] = self.layers[0]

    def __call__(self, token: int, pos: int, head: bool = True) -> int:
        """Decode `token` at position `pos` -> the greedy next token (logits [V] in
        `self.logits`); head=False stops after the last layer (x [1, D] in `self.x`)."""
        if pos + 1 > self.n_ctx:
            raise ValueError(f"context is full: {pos + 1} tokens > n_ctx {self.n_ctx}")
        if self.embd is not None:
            self.x[:] = self.embd[token]
        else:
            self.x[:] = self.tier.embed(np.array([token]))[0]
        self._workspace()
        args = (
            self.x, pos, head, self.shape, self.eps, self.norms, self.qkn,
            self.out_norm, self.mats, self.hmat, self.kc, self.vc, self.cos, self.sin, self.hx,
            self.qkv, self.att, self.probs, self.ids, self.tok, self.wts, self.y, self.logits,
            self.act_d, self.act_o, self.hist, self.ldescs, self.pool._job, self.djob, self.aj,
            self.afn, self.ctl, self.nt, *self.pool.team_knobs()[1:],
        )  # fmt: skip
        if self.team is not None:
            with self.team.lock:
                best, na = _decode(*args)
        else:
            best, na = _decode(*args)
        if na < 0:
            raise RuntimeError("CPU pool: a team barrier timed out in the decode step")
        lw = self.layers[0]
        self.runner.bytes_read += na * lw.expert_nbytes
        self.runner.gguf_bytes += na * lw.expert_gguf_bytes
        return int(best)


def _mat(lin) -> np.ndarray:
    """A QuantLinear's row of `mats`: (address, rows, row bytes, share address, act code)."""
    m = lin.m
    row = (m.data.ctypes.data, m.rows, m.data.shape[1], dense_share_address(m.kernel), m.act)
    return np.array(row, np.int64)
