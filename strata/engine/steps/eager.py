"""Layer by layer with eager launches: every prompt, and the decode steps of a tier without graph
steps (the CPU-only tier, `--cuda-graphs off`, or a card serving its misses by uploads).

T = tokens in the step, D = hidden, E = experts, L = layers.
"""

from __future__ import annotations

import numpy as np

from strata.engine.moe import Moe
from strata.engine.stats import EngineStats
from strata.engine.tier import Tier
from strata.model.args import ModelArgs


class EagerStep:
    """Embed, then per layer attention, router and experts on the tier, the host routing between
    (`Moe`). On a card a prompt's top-k runs there where it can (`picks_on_card`: no host top-k
    between its router and its experts; traces keep the host's, which records the
    probabilities); with every expert resident the picks are grouped on the card as well
    (`grouped`: nothing read back between the layers, the counts come at the end)."""

    kind = "eager"

    def __init__(
        self,
        args: ModelArgs,
        tier: Tier,
        moe: Moe,
        stats: EngineStats,
        picks_on_card: bool = False,
        grouped: bool = False,
    ):
        self.args, self.tier, self.moe, self.stats = args, tier, moe, stats
        self.picks_on_card = picks_on_card
        self.grouped = picks_on_card and grouped

    def layers(self, ids: np.ndarray, pos: int, decode: bool):
        """Embed ids [T] and run every layer at positions pos.. -> the last residual x [T, D]
        (the tier's array kind)."""
        a, tier, moe = self.args, self.tier, self.moe
        x = tier.embed(ids)  # [T, D]
        on_card = not decode and self.picks_on_card
        grouped = on_card and self.grouped
        for i in range(a.n_layer):
            x = tier.attention(i, x, pos)
            if grouped:
                h, y = tier.moe_on_card(i, x)  # [T, D], [T, D]
            elif on_card:
                h, pk, pw = tier.router_picks(i, x)  # [T, D], ids [T, K], weights [T, K]
                y = moe(i, h, None, decode, pos, picks=(pk, pw))
            else:
                h, logits = tier.router(i, x)  # [T, D], [T, E]
                y = moe(i, h, logits, decode, pos)
            if a.shared_ff:
                y = y + tier.shared_expert(i, h)
            x = x + y
        if grouped:
            counts = tier.take_pick_counts()  # [L, E]
            self.stats.expert_hist += counts
            self.stats.hits += int(counts.sum())
        return x
