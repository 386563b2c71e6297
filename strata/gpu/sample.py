"""Sampling on the card (kernels/sample.cu): launcher, device buffers, and `sample_ref`, the
NumPy reference the host `Sampler` itself runs, so host and device draw the same token for the
same logits, knobs and uniform u.

The chain is llama.cpp's: top-k -> softmax -> top-p -> min-p -> temperature -> draw. Rank order
is logit descending, lower index first on ties. Probabilities relative to the top one are held in
fixed point (q = floor(e * 2^40 + 0.5), u64) so that every sum is an exact integer whatever order
the card adds in; the draw is an inverse CDF over the kept tokens in vocabulary order (the card
needs no sort). See the kernel's header for each step's formula.

V = vocab.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from strata.gpu.rawmod import Kernels, i32

THREADS = 1024  # one block (sample.cu's SAMPLE_THREADS)
FIX = 2.0**40  # fixed-point scale of relative probabilities
MAX_VOCAB = 1 << 23  # keeps V * 2^40 within u64
N_KNOBS = 5  # [top_k, top_p, min_p, temperature, u]


class SampleKnobs(Protocol):
    """strata.engine.sampling.SamplingParams (duck-typed: the GPU tier never imports the engine)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float


def knob_values(params: SampleKnobs, u: float) -> np.ndarray:
    """The kernel's knobs [top_k, top_p, min_p, temperature, u] (float64; top_k 0 = all)."""
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must be in [0, 1), got {u}")
    k = min(int(params.top_k), MAX_VOCAB)
    return np.array([k, params.top_p, params.min_p, params.temperature, u], np.float64)


class SampleBufs:
    """The sampler's device buffers, allocated once: knobs [5] f64, q [V] u64, the token id."""

    def __init__(self, cp, n_vocab: int):
        if n_vocab > MAX_VOCAB:
            raise ValueError(f"device sampling supports V <= {MAX_VOCAB}, not {n_vocab}")
        self.n_vocab = int(n_vocab)
        self.knobs = cp.zeros((N_KNOBS,), np.float64)
        self.work = cp.zeros((n_vocab,), np.uint64)
        self.tok = cp.zeros((1,), np.int32)
        self.tok_h = np.zeros((1,), np.int32)  # eager read-back target

    @staticmethod
    def bytes_for(n_vocab: int) -> int:
        return 8 * N_KNOBS + 8 * n_vocab + 4


def sample_row(K: Kernels, logits, v: int, bufs: SampleBufs) -> None:
    """bufs.tok[0] = the token drawn from logits[:v] (row 0) with the knobs in bufs.knobs; on
    the current stream, capturable (no host sync, no allocation)."""
    K.fn("sample.cu", "sample_row")(
        (1,), (THREADS,), (logits, i32(v), bufs.knobs, bufs.work, bufs.tok)
    )


def sample_logits(K: Kernels, logits, v: int, bufs: SampleBufs, params, u: float) -> int:
    """Eager: upload the knobs, sample logits[:v] on the card, read back the id (one sync)."""
    bufs.knobs.set(knob_values(params, u))
    sample_row(K, logits, v, bufs)
    bufs.tok.get(out=bufs.tok_h)
    return int(bufs.tok_h[0])


# ---- the NumPy reference ----
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


def kept_ref(logits: np.ndarray, params: SampleKnobs) -> np.ndarray:
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


def sample_ref(logits: np.ndarray, params: SampleKnobs, u: float) -> int:
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
