"""The tier protocols the engine drives.

`Tier`: what every tier has (the CPU-only tier, `strata.cpu.tier.HostTier`, computes it on the
host; the GPU tier, `strata.gpu.cupy_tier.CupyTier`, on the card). `CardTier`: what a tier on a
GPU adds (graph decode steps, routing on the card, expert slots and their uploads, the host
boundary). Which of the two a tier is, is its `name`, read once when the engine is built
(`is_card`); the engine never probes a tier for a method.

T = tokens in the step, D = hidden, E = experts, K = experts per token, V = vocab, L = layers.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

# tier names of the tiers that run on a GPU (CardTier)
CARD_TIERS = frozenset({"cupy"})


class Tier(Protocol):
    name: str
    n_ctx: int
    stage_n: int  # staging slots for a prompt's missed experts (`experts_staged`); 0: none

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

    def experts_staged(
        self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """`experts` for a prompt's missed experts, run from the staging slots."""

    def shared_expert(self, layer: int, h: np.ndarray) -> np.ndarray:
        """qwen2moe's sigmoid-gated shared expert -> [T, D] (zeros where the model has none)."""

    def output(self, x: np.ndarray) -> np.ndarray:
        """Final norm + lm_head: x [T, D] -> logits [T, V]."""

    def output_sample(self, x: np.ndarray, params, u: float) -> int:
        """The sampling chain (strata/gpu/sample.py) on the last row's logits with uniform u."""


class CardTier(Tier, Protocol):
    all_resident: bool  # every expert in a slot (fixed once the tier is loaded)
    expert_uploads: int  # uploads into the cache's slots so far

    def graph_decoder(self):
        """The CUDA-graph decode steps of this tier (`strata.gpu.decode_graph.GraphDecoder`)."""

    def routes_on_device(self) -> bool:
        """Whether top-k and CAR can run on this card for this model."""

    def to_host(self, a) -> np.ndarray:
        """a (either kind) as a host array."""

    def to_device(self, a):
        """a (either kind) as a device array."""

    def load_resident(self, mask: np.ndarray) -> np.ndarray:
        """Fill the slots with the experts of mask [L, E]; the resident mask [L, E] after."""

    def prefetch(self, layer: int, e: int, evict: int | None = None) -> None:
        """Upload expert (layer, e) on the copy stream, into the slot of `evict`."""

    def slots_for(self, layer: int, ids: np.ndarray) -> np.ndarray:
        """Slots of ids [T, K] (uploading missing experts); -1 where ids < 0."""

    def sync_uploads(self) -> None:
        """Wait for the uploads `slots_for` started."""

    def router_picks(self, layer: int, x) -> tuple[object, np.ndarray, np.ndarray]:
        """`router` with the top-k on the card: (h, ids [T, K], weights [T, K])."""

    def moe_on_card_ok(self) -> bool:
        """Whether `moe_on_card` can serve a prompt."""

    def moe_on_card(self, layer: int, x) -> tuple[object, object]:
        """A prompt's router, top-k and resident experts on the card: (h, the experts' sum)."""

    def take_pick_counts(self) -> np.ndarray:
        """The picks `moe_on_card` counted since the last call, [L, E] (then zeroed)."""


def is_card(tier: Tier) -> bool:
    """Whether `tier` runs on a GPU (a `CardTier`)."""
    return tier.name in CARD_TIERS
