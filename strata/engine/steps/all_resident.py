"""Every expert on the card: one CUDA graph a token, routing on the card, nothing from the host
between the layers."""

from __future__ import annotations

import numpy as np

from strata.engine.stats import EngineStats
from strata.engine.tier import CardTier
from strata.model.args import ModelArgs


class AllResidentGraphStep:
    kind = "all"

    def __init__(self, args: ModelArgs, tier: CardTier, stats: EngineStats):
        self.args, self.tier, self.stats = args, tier, stats
        self._layer_rows = np.arange(args.n_layer)[:, None]  # [L, 1]

    def __call__(self, token: int, pos: int, pick: str | None):
        a, st = self.args, self.stats
        g = self.tier.graph_decoder()
        logits = g.step_all_resident(token, pos, pick)
        np.add.at(st.expert_hist, (self._layer_rows, g.picks_h.a), 1)
        st.hits += a.n_layer * a.n_expert_used
        return logits
