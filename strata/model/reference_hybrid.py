"""The float64 reference forward of qwen3next (gated DeltaNet + gated attention + MoE with a
shared expert), on a `Reference`'s weights, matmuls and norms (strata/model/reference.py).

Layer i: x += mixer(attn_norm(x)); h = post_attention_norm(x); x += moe(h) + shared(h).
The DeltaNet pieces are in reference_deltanet.py; the NextN layers after the trunk are skipped.
Shape letters: strata/model/args.py.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import MODEL_TENSOR as MT

from strata.model.arch.common import name
from strata.model.arch.qwen3next import ssm_a_name
from strata.model.reference_deltanet import (
    causal_conv,
    delta_rule,
    gated_rms_norm,
    l2_norm,
    sigmoid,
    silu,
    softplus,
    split_ba,
    split_legacy_qkvz,
)


def deltanet_inputs(ref, i: int, h: np.ndarray):
    """The projections of DeltaNet layer i from h [T, D]: (qkv [T, C], z [T, Hv*Dv],
    g [T, Hv], beta [T, Hv])."""
    a = ref.args
    if ref.model.has(name(MT.ATTN_QKV, i)):
        qkv = ref.matmul(h, MT.ATTN_QKV, i)  # [T, C]
        z = ref.matmul(h, MT.ATTN_GATE, i)  # [T, Hv*Dv]
    else:
        qkv, z = split_legacy_qkvz(ref.matmul(h, MT.SSM_IN, i), a.ssm_n_group, a.ssm_d_state)
    if ref.model.has(name(MT.SSM_BETA_ALPHA, i)):  # qwen3next: interleaved per key head
        b, alpha = split_ba(ref.matmul(h, MT.SSM_BETA_ALPHA, i), a.ssm_n_group)  # [T, Hv] each
    else:  # qwen35moe: two projections
        b, alpha = ref.matmul(h, MT.SSM_BETA, i), ref.matmul(h, MT.SSM_ALPHA, i)
    g = softplus(alpha + ref.w(name(MT.SSM_DT, i, "bias"))) * ref.w(ssm_a_name(i))
    return qkv, z, g, sigmoid(b)


def deltanet(ref, i: int, x: np.ndarray, state: dict) -> np.ndarray:
    """DeltaNet layer i on x [T, D] with its state (conv [Kc-1, C], m [Hv, Dv, Dk], both
    updated) -> the new residual."""
    a = ref.args
    t, hk, hv, dk = x.shape[0], a.ssm_n_group, a.ssm_dt_rank, a.ssm_d_state
    h = ref.rms_norm(x, ref.w(MT.ATTN_NORM, i))  # [T, D]
    qkv, z, g, beta = deltanet_inputs(ref, i, h)
    y, state["conv"] = causal_conv(qkv, state["conv"], ref.w(MT.SSM_CONV1D, i))
    y = silu(y)  # [T, C]
    q = l2_norm(y[:, : hk * dk].reshape(t, hk, dk), a.rms_eps)  # [T, Hk, Dk]
    k = l2_norm(y[:, hk * dk : 2 * hk * dk].reshape(t, hk, dk), a.rms_eps)
    v = y[:, 2 * hk * dk :].reshape(t, hv, dk)  # [T, Hv, Dv]
    q, k = value_head_keys(a, q), value_head_keys(a, k)  # [T, Hv, Dk]
    o = delta_rule(q, k, v, g, beta, state["m"])  # [T, Hv, Dv]
    o = gated_rms_norm(o, ref.w(MT.SSM_NORM, i), z.reshape(t, hv, dk), a.rms_eps)
    return ref.residual(x + ref.matmul(o.reshape(t, -1), MT.SSM_OUT, i))


def value_head_keys(a, x: np.ndarray) -> np.ndarray:
    """[T, Hk, Dk] -> [T, Hv, Dk]: value head j's key head, j // (Hv/Hk) or (tiled) j % Hk."""
    rep = a.ssm_dt_rank // a.ssm_n_group
    return np.tile(x, (1, rep, 1)) if a.v_heads_tiled else np.repeat(x, rep, axis=1)


def partial_rope(ref, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """NEOX RoPE over the first n_rot dims of each head (frequencies by n_rot), the rest as is.
    (qwen35moe's multi-section RoPE is this for text: every section has the token's position.)"""
    r = ref.args.rope_dims
    if r == x.shape[-1]:
        return ref.rope(x, pos)
    return np.concatenate([ref.rope(x[..., :r], pos), x[..., r:]], axis=-1)


def gated_attention(ref, i: int, x: np.ndarray, pos: np.ndarray, kv: dict) -> np.ndarray:
    """Full attention layer i on x [T, D] at positions pos, appending to kv (k, v lists of
    [T, G, Dh]) -> the new residual. Output times sigmoid(the q projection's gate half)."""
    a = ref.args
    t = x.shape[0]
    h = ref.rms_norm(x, ref.w(MT.ATTN_NORM, i))
    qg = ref.matmul(h, MT.ATTN_Q, i).reshape(t, a.n_head, 2 * a.head_dim)  # [T, H, 2*Dh]
    q, gate = qg[..., : a.head_dim], qg[..., a.head_dim :]  # [T, H, Dh] each
    k = ref.matmul(h, MT.ATTN_K, i).reshape(t, a.n_head_kv, a.head_dim)  # [T, G, Dh]
    v = ref.matmul(h, MT.ATTN_V, i).reshape(t, a.n_head_kv, a.v_head_dim)
    q = ref.rms_norm(q, ref.w(MT.ATTN_Q_NORM, i))
    k = ref.rms_norm(k, ref.w(MT.ATTN_K_NORM, i))
    q, k = partial_rope(ref, q, pos), partial_rope(ref, k, pos)
    if ref.llama:  # f16 KV cache; q meets f16 K as f16
        q, k, v = (x.astype(np.float16).astype(np.float64) for x in (q, k, v))
    kv["k"].append(k)
    kv["v"].append(v)
    kc, vc = np.concatenate(kv["k"]), np.concatenate(kv["v"])  # [S, G, Dh]
    s, rep = kc.shape[0], a.n_head // a.n_head_kv
    kc, vc = np.repeat(kc, rep, axis=1), np.repeat(vc, rep, axis=1)  # [S, H, Dh]
    scores = np.einsum("thd,shd->hts", q, kc) / np.sqrt(a.head_dim)  # [H, T, S]
    causal = np.arange(s)[None, :] <= (s - t + np.arange(t))[:, None]  # [T, S]
    scores = np.where(causal[None], scores, -np.inf)
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if ref.llama:
        p = p.astype(np.float16).astype(np.float64)
    o = np.einsum("hts,shd->thd", p, vc)  # [T, H, Dh]
    o = (o * sigmoid(gate)).reshape(t, -1)  # [T, H*Dh]
    return ref.residual(x + ref.matmul(o, MT.ATTN_OUT, i))


def moe(ref, i: int, x: np.ndarray, record=None, margins=None) -> np.ndarray:
    """post_attention_norm, then the routed experts (top-K renormalized) plus the sigmoid-gated
    shared expert -> the new residual."""
    h = ref.rms_norm(x, ref.w(MT.ATTN_POST_NORM, i))  # [T, D]
    ids, wts = ref.route(i, h)  # [T, K]
    if record is not None:
        record.append(ids)
    if margins is not None:
        margins.append(ref.router_margin(i, h))
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            out[t] += wts[t, k] * ref.expert(i, int(ids[t, k]), h[t : t + 1])[0]
    sh_gate = ref.matmul(h, MT.FFN_GATE_SHEXP, i)
    sh = ref.matmul(silu(sh_gate) * ref.matmul(h, MT.FFN_UP_SHEXP, i), MT.FFN_DOWN_SHEXP, i)
    gate = sigmoid(h @ ref.w(MT.FFN_GATE_INP_SHEXP, i))  # [T]
    return ref.residual(x + out + sh * gate[:, None])


def new_state(ref) -> dict:
    """An empty sequence: per DeltaNet layer zero conv and recurrent states, per attention layer
    an empty KV list, position 0."""
    a = ref.args
    c = 2 * a.ssm_n_group * a.ssm_d_state + a.ssm_d_inner
    st: dict = {"pos": 0}
    for i in range(a.n_layer):
        if a.is_recurrent(i):
            m = np.zeros((a.ssm_dt_rank, a.ssm_d_state, a.ssm_d_state))  # [Hv, Dv, Dk]
            st[i] = {"conv": np.zeros((a.ssm_d_conv - 1, c)), "m": m}
        else:
            st[i] = {"k": [], "v": []}
    return st


def forward_hybrid(ref, tokens, record=None, margins=None, state: dict | None = None):
    """Logits [T, V] for `tokens` after the sequence `state` holds (None: a new one; updated)."""
    return ref.matmul(trunk_hidden(ref, tokens, state, record, margins), MT.OUTPUT)  # [T, V]


def new_nextn_state() -> dict:
    """The NextN block's own KV (its attention layer) for one sequence."""
    return {"k": [], "v": []}


def forward_nextn(ref, h: np.ndarray, tokens, pos, state: dict | None = None) -> np.ndarray:
    """The NextN (MTP) block of layer L: from the trunk's output-normed hidden rows h [T, D]
    and the next tokens [T] (at positions pos [T]), the draft logits [T, V] for the token
    after each. llama.cpp's graph_mtp: eh_proj([enorm(embed(tok)), hnorm(h)]) -> a gated
    attention block with MoE and shared expert -> shared_head_norm (else output_norm) ->
    shared_head_head (else output). `state` holds the block's KV across calls."""
    i = ref.args.n_layer
    st = new_nextn_state() if state is None else state
    ids = np.asarray(tokens, dtype=np.int64)
    own = name(MT.NEXTN_EMBED_TOKENS, i)
    e = ref.w(own if ref.model.has(own) else MT.TOKEN_EMBD)[ids]  # [T, D]
    eh = np.concatenate(
        [ref.rms_norm(e, ref.w(MT.NEXTN_ENORM, i)), ref.rms_norm(h, ref.w(MT.NEXTN_HNORM, i))],
        axis=-1,
    )  # [T, 2D]
    x = ref.matmul(eh, MT.NEXTN_EH_PROJ, i)  # [T, D]
    x = gated_attention(ref, i, x, np.asarray(pos, dtype=np.float64), st)
    x = moe(ref, i, x)
    head_norm = name(MT.NEXTN_SHARED_HEAD_NORM, i)
    x = ref.rms_norm(x, ref.w(head_norm if ref.model.has(head_norm) else MT.OUTPUT_NORM))
    head = name(MT.NEXTN_SHARED_HEAD_HEAD, i)
    return ref.matmul(x, head if ref.model.has(head) else MT.OUTPUT)  # [T, V]


def trunk_hidden(ref, tokens, state=None, record=None, margins=None) -> np.ndarray:
    """The trunk's output-normed hidden rows [T, D] (what the LM head and the NextN block read)."""
    a = ref.args
    st = new_state(ref) if state is None else state
    ids = np.asarray(tokens, dtype=np.int64)
    x = ref.w(MT.TOKEN_EMBD)[ids]
    pos = np.arange(st["pos"], st["pos"] + len(ids), dtype=np.float64)
    for i in range(a.n_layer):
        if a.is_recurrent(i):
            x = deltanet(ref, i, x, st[i])
        else:
            x = gated_attention(ref, i, x, pos, st[i])
        x = moe(ref, i, x, record, margins)
    st["pos"] += len(ids)
    return ref.rms_norm(x, ref.w(MT.OUTPUT_NORM))
