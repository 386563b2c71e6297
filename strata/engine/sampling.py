"""Token sampling: greedy, temperature, top-k, top-p, min-p, seeded (llama.cpp's chain order)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 40  # 0 = off
    top_p: float = 0.95  # 1 = off
    min_p: float = 0.05  # 0 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")


class Sampler:
    def __init__(self, params: SamplingParams):
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray) -> int:
        p = self.p
        if p.temperature == 0:
            return int(np.argmax(logits))
        z = logits.astype(np.float64)
        cand = np.argsort(-z, kind="stable")  # candidates, best first
        if p.top_k:
            cand = cand[: p.top_k]
        zc = z[cand]
        probs = np.exp(zc - zc[0])
        probs /= probs.sum()
        if p.top_p < 1:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
            cand, zc, probs = cand[:keep], zc[:keep], probs[:keep]
        if p.min_p > 0:
            keep = probs >= p.min_p * probs[0]
            cand, zc = cand[keep], zc[keep]
        zt = zc / p.temperature
        probs = np.exp(zt - zt.max())
        probs /= probs.sum()
        return int(cand[self.rng.choice(len(cand), p=probs)])
