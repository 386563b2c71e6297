"""The device-tier interface the engine drives. `HostTier` (NumPy) implements it everywhere;
the CuPy tier implements the same methods on the card.

T = tokens in the step, D = hidden, E = experts, K = experts per token, V = vocab.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class DeviceTier(Protocol):
    name: str
    n_ctx: int

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """ids [T] -> x [T, D]."""

    def attention(self, layer: int, x: np.ndarray, pos0: int) -> np.ndarray:
        """Attention block with residual; appends T positions at pos0 to the KV cache."""

    def router(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ffn_norm and router: x [T, D] -> (h [T, D], logits [T, E])."""

    def experts(
        self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """Σ_k weights[t, k] · expert_{ids[t, k]}(h[t]) -> [T, D]; ids < 0 are skipped."""

    def shared_expert(self, layer: int, h: np.ndarray) -> np.ndarray:
        """qwen2moe's sigmoid-gated shared expert -> [T, D] (zeros where the model has none)."""

    def output(self, x: np.ndarray) -> np.ndarray:
        """Final norm + lm_head: x [T, D] -> logits [T, V]."""
