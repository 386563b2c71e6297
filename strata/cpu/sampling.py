"""The sampling chain in NumPy (`sample_ref`): the math the GPU tier's sample kernel does, so the
CPU-only tier, the host `Sampler` and the card draw the same token for the same logits, knobs
and uniform u. llama.cpp's chain: top-k -> softmax -> top-p -> min-p -> temperature -> draw;
rank order is logit descending, lower index first on ties; probabilities relative to the top one
in fixed point (q = floor(e * 2^40 + 0.5), u64), so every sum is an exact integer.
"""

from __future__ import annotations

import numpy as np

FIX = 2.0**40  # fixed-point scale of relative probabilities


def order_keys(z: np.ndarray) -> np.ndarray:
    """float32 [V] -> uint32 keys whose order is the float order (-0 gets +0's key)."""
    b = np.ascontiguousarray(z, np.float32).view(np.uint32).copy()
    b[b == 0x80000000] = 0
    return np.where(b & 0x80000000, ~b, b | 0x80000000).astype(np.uint32)


def _fix(e: np.ndarray) -> np.ndarray:
    return np.floor(e * FIX + 0.5).astype(np.uint64)


def _rel_exp(z: np.ndarray, m: np.float64, t: float) -> np.ndarray:
    """exp((z - m) / t) in float64, exactly 1 where z == m."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        d = z.astype(np.float64) - m  # nan only where z == m == +-inf
        return np.where(z == m, 1.0, np.exp(d / t))


def _rank_prefix(key: np.ndarray, k: int) -> np.ndarray:
    """Indices of the first k of rank order (key descending, lower index first), in that order."""
    neg = -key.astype(np.int64)
    if k >= key.size:
        return np.argsort(neg, kind="stable")
    kth = np.partition(neg, k - 1)[k - 1]
    above = np.flatnonzero(neg < kth)
    idx = np.concatenate([above, np.flatnonzero(neg == kth)[: k - above.size]])
    return idx[np.argsort(neg[idx], kind="stable")]


def kept_ref(logits: np.ndarray, params) -> np.ndarray:
    """The ids the chain keeps (top-k, top-p, min-p), in vocabulary order. [n]"""
    z = np.ascontiguousarray(logits, np.float32).ravel()  # [V]
    v = z.size
    key = order_keys(z)  # [V]
    k = params.top_k if 0 < params.top_k < v else v
    # top-k (the set; rank order only where top-p needs it)
    cand = _rank_prefix(key, k) if k < v or params.top_p < 1 else np.arange(v)
    m = np.float64(z[int(np.argmax(key))])  # the top logit
    q = _fix(_rel_exp(z[cand], m, 1.0))  # [k] softmax, fixed point
    if params.top_p < 1:
        cum = np.cumsum(q, dtype=np.uint64)
        s = int(cum[-1])
        t = max(min(int(np.ceil(params.top_p * float(s))), s), 1)
        keep = int(np.searchsorted(cum, np.uint64(t), side="left")) + 1
        cand, q = cand[:keep], q[:keep]
    return np.sort(cand[q.astype(np.float64) >= params.min_p * FIX])  # min-p


def sample_ref(logits: np.ndarray, params, u: float) -> int:
    """The token the chain draws from logits [V] with uniform u in [0, 1) (sample.cu's math):
    the inverse CDF of the temperature softmax over the kept ids, in vocabulary order."""
    z = np.ascontiguousarray(logits, np.float32).ravel()  # [V]
    if params.temperature <= 0:
        return int(np.argmax(z))
    cand = kept_ref(z, params)  # [n]
    m = np.float64(z[int(np.argmax(order_keys(z)))])
    r = _fix(_rel_exp(z[cand], m, float(params.temperature)))  # [n]
    cum = np.cumsum(r, dtype=np.uint64)
    w = int(cum[-1])
    t = min(int(np.floor(u * float(w))), w - 1)
    return int(cand[int(np.searchsorted(cum, np.uint64(t), side="right"))])
