"""qwen3next's gated DeltaNet on the host, in float32 as llama.cpp's CPU ops compute it.

    T = tokens, C = conv channels, Kc = conv kernel, Hk / Hv = key / value heads,
    Dk = key head dim (= Dv, the value head dim)

Per sequence and DeltaNet layer the state is the conv window (the last Kc-1 inputs [Kc-1, C]) and
the recurrent matrix per value head M [Hv, Dv, Dk] (strata/model/reference_deltanet.py defines
the recurrence). `conv` and `delta_rule` take any T: a decode step is T = 1, a prompt (or a
chunk of one) runs its tokens in order through the same loop, so a prompt fed in chunks leaves
the same state, bit for bit, as its tokens fed one by one. Each Numba kernel sits beside its
NumPy reference (`*_ref`) and is tested against it.
"""

from __future__ import annotations

import numpy as np
from numba import njit


def l2_norm(x: np.ndarray, eps: np.float32) -> np.ndarray:
    """x / sqrt(sum x^2 + eps) over the last axis: ggml's rms_norm(x, eps/n) / sqrt(n), the sum
    of squares in double as ggml's, the rest in float32."""
    n = x.shape[-1]
    ms = (np.sum(np.square(x, dtype=np.float64), axis=-1, keepdims=True) / n).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(ms + np.float32(eps / n))
    return x * scale * np.float32(1.0 / np.sqrt(n))


def conv_ref(x: np.ndarray, state: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Causal conv1d: x [T, C], state [Kc-1, C] (updated in place: the last Kc-1 inputs),
    w [C, Kc] -> y [T, C] float32 (before the SiLU), each sum in kernel order."""
    t, kc = x.shape[0], w.shape[1]
    xin = np.concatenate([state, x], axis=0)  # [Kc-1+T, C]
    y = np.zeros(x.shape, np.float32)
    for j in range(kc):
        y += xin[j : j + t] * w[:, j]
    state[...] = xin[t:]
    return y


@njit(cache=True, nogil=True)
def conv(x, state, w):
    """`conv_ref` compiled: the same sums in the same order."""
    t, c = x.shape
    kc = w.shape[1]
    y = np.empty((t, c), np.float32)
    for s in range(t):
        for j in range(kc):  # row s + j of [state; x]
            r = s + j
            if r < kc - 1:
                for ch in range(c):
                    y[s, ch] = (y[s, ch] if j else np.float32(0.0)) + state[r, ch] * w[ch, j]
            else:
                for ch in range(c):
                    y[s, ch] = (y[s, ch] if j else np.float32(0.0)) + x[r - kc + 1, ch] * w[ch, j]
    for j in range(kc - 1):  # the last Kc-1 rows of [state; x], read before overwritten
        r = t + j
        for ch in range(c):
            state[j, ch] = state[r, ch] if r < kc - 1 else x[r - kc + 1, ch]
    return y


def delta_rule_ref(q, k, v, g, beta, m: np.ndarray) -> np.ndarray:
    """The gated delta rule token by token in float32: q, k [T, Hv, Dk] (L2-normed), v
    [T, Hv, Dv], g, beta [T, Hv], m [Hv, Dv, Dk] updated in place -> o [T, Hv, Dv]."""
    scale = np.float32(1.0 / np.sqrt(q.shape[-1]))
    out = np.empty(v.shape, np.float32)
    for t in range(q.shape[0]):
        m *= np.exp(g[t]).astype(np.float32)[:, None, None]
        d = (v[t] - np.einsum("hjd,hd->hj", m, k[t])) * beta[t][:, None]  # [Hv, Dv]
        m += d[:, :, None] * k[t][:, None, :]
        out[t] = np.einsum("hjd,hd->hj", m, q[t]) * scale
    return out


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"})
def delta_rule(q, k, v, g, beta, m):
    """`delta_rule_ref` compiled (llama.cpp's loop: decay, correction, rank-1 update, read),
    the dot products summed in SIMD lanes (reassociated, as ggml_vec_dot_f32 does: float32
    noise against the reference; a given T and state give the same bits every time)."""
    t_n, hv, dk = q.shape
    dv = v.shape[2]
    scale = np.float32(1.0 / np.sqrt(dk))
    out = np.empty((t_n, hv, dv), np.float32)
    d = np.empty(dv, np.float32)
    for h in range(hv):
        s = m[h]
        for t in range(t_n):
            decay = np.float32(np.exp(g[t, h]))
            for j in range(dv):
                acc = np.float32(0.0)
                for i in range(dk):
                    s[j, i] *= decay
                    acc += s[j, i] * k[t, h, i]
                d[j] = (v[t, h, j] - acc) * beta[t, h]
            for j in range(dv):
                acc = np.float32(0.0)
                for i in range(dk):
                    s[j, i] += k[t, h, i] * d[j]
                    acc += s[j, i] * q[t, h, i]
                out[t, h, j] = acc * scale
    return out


def gated_rms_norm(o: np.ndarray, w: np.ndarray, z: np.ndarray, eps: np.float32) -> np.ndarray:
    """RMS norm over each head's Dv (sum of squares in double, eps inside the mean) times w,
    times SiLU(z). o, z [T, Hv, Dv]."""
    ms = np.mean(np.square(o, dtype=np.float64), axis=-1, keepdims=True)
    n = o * (1.0 / np.sqrt(ms + eps)).astype(np.float32) * w
    return n * (z / (np.float32(1.0) + np.exp(-z)))


def softplus(x: np.ndarray) -> np.ndarray:
    """ggml_softplus: x above 20 as is, else logf(1 + expf(x)), in float32."""
    x = np.asarray(x, np.float32)
    return np.where(x > 20, x, np.log(np.float32(1) + np.exp(np.minimum(x, 20)))).astype(np.float32)
