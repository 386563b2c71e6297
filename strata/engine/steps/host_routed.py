"""A hybrid decode step routed on the host: two CUDA graphs a layer, the host's top-k, trace, CAR
and adaptive cache between them (`Moe.route`), the CPU pool on the misses while the card runs
the resident experts. Taken where the host must see every layer's scores (a router trace) or
the card cannot route this model."""

from __future__ import annotations

import time

import numpy as np

from strata.engine.moe import MissRunner, Moe
from strata.engine.stats import EngineStats
from strata.engine.tier import CardTier
from strata.model.args import ModelArgs


class HostRoutedGraphStep:
    kind = "hybrid"

    def __init__(
        self, args: ModelArgs, tier: CardTier, moe: Moe, miss_runner: MissRunner, stats: EngineStats
    ):
        self.args, self.tier, self.moe, self.stats = args, tier, moe, stats
        self.miss_runner = miss_runner

    def __call__(self, token: int, pos: int, pick: str | None):
        """Per layer: the card's front half, host routing, resident experts launched, the pool
        on the misses meanwhile; its sum joins on the card at the next layer's front."""
        a, st, tier, moe = self.args, self.stats, self.tier, self.moe
        pc = time.perf_counter
        g = tier.graph_decoder()
        g.begin(token, pos)
        for i in range(a.n_layer):
            t0 = pc()
            h, logits = g.front(i)  # [1, D], [1, E] pinned host views
            t1 = pc()
            ids, weights, hit = moe.route(i, logits, True, pos)
            uploads = tier.expert_uploads
            slots = tier.slots_for(i, np.where(hit, ids, -1))  # adaptive admits upload here
            if tier.expert_uploads != uploads:
                tier.sync_uploads()
            g.pair_h.a[:] = slots[0]
            g.pairw_h.a[:] = weights[0]
            g.pairexp_h.a[:] = np.maximum(ids[0], 0)  # gpt-oss: whose biases the kernels add
            g.experts(i)
            moe.prefetch(i)
            t2 = pc()
            if hit.all():
                g.y_h.a[:] = 0.0
            else:
                g.y_h.a[:] = self.miss_runner.experts(i, h, np.where(hit, -1, ids), weights)
            t3 = pc()
            st.add_window(t0, t1, t2, t3, i, hit.size - int(hit.sum()))
        return g.finish(pick)
