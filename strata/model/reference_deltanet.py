"""The gated DeltaNet pieces of qwen3next in float64 NumPy: the oracle the tiers are held to.

Per value head h (Hv of them) the recurrent state M [Dv, Dk] (llama.cpp's layout: row j is
value channel j) evolves per token t as
    M <- M * exp(g_t)                     (decay, g_t = ssm_a * softplus(alpha_t + dt_bias) < 0)
    d  = beta_t * (v_t - M k_t)           (beta_t = sigmoid(b_t); the delta rule's correction)
    M <- M + d k_t^T
    o_t = M q_t / sqrt(Dk)
with q, k L2-normed (x / sqrt(sum x^2 + eps)) and key head h // (Hv/Hk) shared by Hv/Hk value
heads. `delta_rule` runs it token by token (the definition); `delta_rule_chunked` computes the
same in chunks (the WY form a prompt kernel uses) and is tested equal to it.

The causal conv1d before it keeps the last Kc-1 input rows as its state [Kc-1, C]:
    y_t[c] = sum_k xin[t + k, c] * w[c, k],  xin = [state; x]   (then SiLU).
Shape letters: strata/model/args.py (T, Hk, Hv, Dk, C, Kc).
"""

from __future__ import annotations

import numpy as np

CHUNK = 64  # tokens per chunk of delta_rule_chunked


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum x^2 + eps) over the last axis (llama.cpp: rms_norm(x, eps/n) / sqrt(n))."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_conv(x: np.ndarray, state: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [T, C], state [Kc-1, C] (the previous inputs), w [C, Kc] -> (y [T, C], new state)."""
    kc = w.shape[1]
    xin = np.concatenate([state, x], axis=0)  # [Kc-1+T, C]
    t = x.shape[0]
    y = np.zeros_like(x)
    for j in range(kc):
        y += xin[j : j + t] * w[:, j]
    return y, xin[t:].copy()  # the last Kc-1 rows


def delta_step(
    m: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray
) -> np.ndarray:
    """One token for every head, state updated in place. m [Hv, Dv, Dk]; q, k [Hv, Dk];
    v [Hv, Dv]; g, beta [Hv] -> o [Hv, Dv]."""
    m *= np.exp(g)[:, None, None]
    d = beta[:, None] * (v - np.einsum("hjd,hd->hj", m, k))  # [Hv, Dv]
    m += d[:, :, None] * k[:, None, :]
    return np.einsum("hjd,hd->hj", m, q) / np.sqrt(q.shape[-1])


def delta_rule(q, k, v, g, beta, m: np.ndarray) -> np.ndarray:
    """T tokens one by one: q, k [T, Hv, Dk], v [T, Hv, Dv], g, beta [T, Hv], state m
    [Hv, Dv, Dk] (updated in place) -> o [T, Hv, Dv]."""
    return np.stack([delta_step(m, q[t], k[t], v[t], g[t], beta[t]) for t in range(q.shape[0])])


def delta_rule_chunked(q, k, v, g, beta, m: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """`delta_rule` by chunks of `chunk` tokens (the UT/WY form): within a chunk the
    corrections solve a unit lower-triangular system; across chunks the state carries. Same
    arguments and result; m updated in place."""
    t, hv, dk = q.shape
    n = -(-t // chunk)
    pad = n * chunk - t

    def chunks(x):  # [T, Hv, ...] -> [Hv, n, chunk, ...] (zero-padded: no update, no decay)
        x = np.concatenate([x, np.zeros((pad, *x.shape[1:]))], axis=0)
        x = x.reshape(n, chunk, *x.shape[1:])
        return np.moveaxis(x, 2, 0)

    qc = chunks(q / np.sqrt(dk))  # [Hv, n, c, Dk]
    kc, vc = chunks(k), chunks(v)
    gc, bc = chunks(g), chunks(beta)  # [Hv, n, c]
    gcum = np.cumsum(gc, axis=-1)  # within a chunk
    tril = np.tril(np.ones((chunk, chunk), bool))
    decay = np.where(tril, np.exp(gcum[..., :, None] - gcum[..., None, :]), 0.0)  # [Hv,n,c,c]
    kb = kc * bc[..., None]
    # A = (I + strictly-lower(beta_i k_i.k_j decay_ij))^-1: the in-chunk corrections
    low = np.where(np.tril(np.ones((chunk, chunk), bool), -1), kb @ np.swapaxes(kc, -1, -2), 0.0)
    a = np.linalg.inv(np.eye(chunk) + low * decay)  # [Hv, n, c, c]
    u = a @ (vc * bc[..., None])  # [Hv, n, c, Dv]
    w = a @ (kb * np.exp(gcum)[..., None])  # [Hv, n, c, Dk]
    s = np.swapaxes(m, -1, -2).copy()  # HF layout [Hv, Dk, Dv]
    out = np.empty_like(u)
    for i in range(n):
        qi, ki, gi = qc[:, i], kc[:, i], gcum[:, i]  # [Hv, c, Dk], [Hv, c]
        attn = np.where(tril, qi @ np.swapaxes(ki, -1, -2), 0.0) * decay[:, i]  # [Hv, c, c]
        v_new = u[:, i] - w[:, i] @ s  # [Hv, c, Dv]
        out[:, i] = (qi * np.exp(gi)[..., None]) @ s + attn @ v_new
        last = gi[:, -1:]  # [Hv, 1]
        s = (
            s * np.exp(last)[..., None]
            + np.swapaxes(ki * np.exp(last - gi)[..., None], -1, -2) @ v_new
        )
    m[...] = np.swapaxes(s, -1, -2)
    o = np.moveaxis(out, 0, 2).reshape(n * chunk, hv, -1)  # [T', Hv, Dv]
    return o[:t]


def gated_rms_norm(o: np.ndarray, w: np.ndarray, z: np.ndarray, eps: float) -> np.ndarray:
    """RMS norm over each head's Dv (eps inside the mean) times w, times SiLU(z). [.., Hv, Dv]"""
    ms = np.mean(o * o, axis=-1, keepdims=True)
    return o / np.sqrt(ms + eps) * w * silu(z)


def split_ba(ba: np.ndarray, hk: int) -> tuple[np.ndarray, np.ndarray]:
    """ssm_ba's output [T, 2*Hv], per key head [b (Hv/Hk), a (Hv/Hk)] -> b, a [T, Hv]."""
    t = ba.shape[0]
    x = ba.reshape(t, hk, 2, -1)
    return x[:, :, 0].reshape(t, -1), x[:, :, 1].reshape(t, -1)


def split_legacy_qkvz(mixed: np.ndarray, hk: int, dk: int) -> tuple[np.ndarray, np.ndarray]:
    """The legacy fused ssm_in output [T, C + Hv*Dv], per key head [q, k, v, z] -> (qkv [T, C]
    in the split form's order: all q, all k, all v; z [T, Hv*Dv])."""
    t = mixed.shape[0]
    x = mixed.reshape(t, hk, -1)
    rv = (x.shape[-1] - 2 * dk) // 2  # Dv * Hv/Hk
    q, k = x[..., :dk], x[..., dk : 2 * dk]
    v, z = x[..., 2 * dk : 2 * dk + rv], x[..., 2 * dk + rv :]
    qkv = np.concatenate([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], axis=-1)
    return qkv, z.reshape(t, -1)
