"""Token sampling: greedy, temperature, top-k, top-p, min-p, seeded (llama.cpp's chain order).

The chain's math is strata/gpu/sample.py's `sample_ref`, shared with the card's kernel."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.cpu.sampling import sample_ref


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
    """The host side of sampling: one uniform u per token from the seeded generator, then
    `sample_ref` (the chain the GPU tier runs on the card, strata/gpu/sample.py). A seed gives
    the same tokens whether a step samples here from the logits or on the card with `draw()`."""

    def __init__(self, params: SamplingParams):
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def draw(self) -> float:
        """The next token's uniform number in [0, 1)."""
        return float(self.rng.random())

    def __call__(self, logits: np.ndarray) -> int:
        if self.p.temperature == 0:
            return int(np.argmax(logits))  # greedy draws no u
        return sample_ref(logits, self.p, self.draw())
