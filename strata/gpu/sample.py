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
