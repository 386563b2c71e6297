"""One layer's experts on the host's routing: top-k, trace, CAR (decode), statistics, the adaptive
cache; then the resident picks on the tier, a prompt's misses on the tier's staging slots, the
rest on the miss runner (the CPU pool; without one, the tier itself), summed.

T = tokens in the step, D = hidden, E = experts, K = experts per token, L = layers.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from strata.engine.helpers import TieredMissRunner
from strata.engine.pcie_split import PcieSplit
from strata.engine.stats import EngineStats
from strata.engine.tier import Tier
from strata.model.args import ModelArgs
from strata.routing.car import CarKnobs, car_plan_fast
from strata.routing.profile import AdaptiveCache, observe_fast
from strata.routing.topk import count_picks
from strata.routing.topk import route as route_picks
from strata.routing.trace import TraceWriter

# a prompt chunk of at least this many tokens runs its missed experts on the tier's staging
# slots where it has them (llama.cpp offloads host-resident weights from a batch of 32)
PREFILL_OFFLOAD_MIN_T = 32


class MissRunner(Protocol):
    def experts(
        self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """Σ_k weights · expert(h) over the picks with ids >= 0 -> [T, D]."""


def _same(a):
    return a


class Moe:
    """The routed experts of a layer. `resident` [L, E] is shared with `adaptive`, which swaps in
    place. `card`: the tier is a `CardTier` (rows go host-ward for the pool and the pool's sum
    comes back; admitted experts are prefetched); `pool`: a miss runner other than the tier."""

    def __init__(
        self,
        args: ModelArgs,
        tier: Tier,
        miss_runner: MissRunner,
        resident: np.ndarray,
        car: CarKnobs | None,
        adaptive: AdaptiveCache | None,
        trace: TraceWriter | None,
        stats: EngineStats,
        card: bool,
        pool: bool,
    ):
        self.args, self.tier, self.miss_runner = args, tier, miss_runner
        self.resident, self.car, self.adaptive, self.trace = resident, car, adaptive, trace
        self.stats = stats
        # a GPU tier's rows go host-ward for the pool and the pool's sum comes back
        self._to_host = _same
        self._to_device = None
        if pool:
            self._to_host = tier.to_host if card else np.asarray
            self._to_device = tier.to_device if card else None
        self._prefetch_to = tier.prefetch if card else None  # uploads of admitted experts
        self._swaps: list[tuple[int, int]] = []  # the adaptive cache's swaps of this layer
        # helper cards: the miss runner splits the misses and follows the swaps
        self.tiers = miss_runner if isinstance(miss_runner, TieredMissRunner) else None
        if self.tiers is not None:
            self.tiers.bind(stats)
        # a card with staging slots beside the pool: decode misses split with the PCIe link
        # (not beside helper cards, which hold some of the misses)
        self.split = None
        if card and pool and getattr(tier, "stage_n", 0):
            link = tier.stage_link()  # measured once at start; --stats reports it
            stats.gather_gbps, stats.link_gbps = (1e-9 / max(v, 1e-30) for v in link)
            if self.tiers is None:
                self.split = PcieSplit(tier, link, stats)

    def route(self, i: int, logits, decode: bool, pos: int, picks=None):
        """Top-k, trace, CAR (decode), statistics, adaptive cache -> ids [T, K], weights
        [T, K], hit [T, K] (picks a resident expert serves). From logits [T, E], or from
        `picks` (ids, weights): the tier's top-k on the card (a prompt without a trace)."""
        a, st = self.args, self.stats
        if picks is not None:
            (ids, weights), probs = picks, None
        else:
            # [T, K], [T, K], [T, E]
            ids, weights, probs = route_picks(logits, a.n_expert_used, a.norm_topk, a.gating)
        count_picks(st.expert_hist[i], ids)
        slack = st.slack.jobs(i, ids.shape[0]) if decode and st.slack is not None else 0.0
        if self.trace is not None:
            self.trace.write(pos, i, ids, probs, decode, slack)
        resident = self.resident[i]  # [E]
        router_ids = ids
        car = self.car
        if decode and car is not None and st.decode_steps >= car.warmup:
            # beside helper cards any card's expert is a candidate (its misses: the pool's)
            on_card = resident if self.tiers is None else self.tiers.on_gpu(i)
            plan = car_plan_fast(ids, probs, on_card, car, slack)  # car_plan's rule, compiled
            st.decode_misses_before_car += plan.misses
            n_sub = int(plan.substituted.sum())
            st.substitutions += n_sub
            st.ratio_sum += float(plan.ratios.sum())
            st.routed_weight += float(weights.sum())
            if n_sub:
                st.subst_weight += float(weights[plan.substituted].sum())
            ids = plan.ids
        elif decode:
            st.decode_misses_before_car += int((~resident[ids]).sum())
        hit = resident[ids]  # [T, K], before this step's swaps: an admitted expert serves
        n_hit = int(hit.sum())  # from the next step on (its upload runs meanwhile)
        st.hits += n_hit
        st.misses += hit.size - n_hit
        self._swaps = []
        if decode and self.adaptive is not None:
            self._swaps = observe_fast(self.adaptive, i, router_ids)
            st.swaps += len(self._swaps)
        elif ids.shape[0] > 1 and self._warms():
            # a prompt re-places the layer's cache for its decode (its own misses already run
            # where `hit` says; the uploads start after its launches, in `prefetch`)
            self._swaps = self.adaptive.warm(i, router_ids)
            st.swaps += len(self._swaps)
            st.warm_swaps += len(self._swaps)
        if self.tiers is not None:  # the evicted take the admitted's places; helpers admit
            self.tiers.rebalance(i, router_ids, self._swaps, decode, self.adaptive)
        return ids, weights, hit

    def _warms(self) -> bool:
        """Whether prompts re-place the cache: an adaptive one (not static: max_swaps > 0)
        not placed by a usage profile."""
        ad = self.adaptive
        return ad is not None and ad.max_swaps > 0 and ad.warm_from_prompts

    def prefetch(self, i: int) -> None:
        """Start the uploads of the experts layer i just admitted (after the step's launches,
        which may still read the slots of the experts they evict)."""
        if self._swaps and self._prefetch_to is not None:
            for cold, e in self._swaps:
                self._prefetch_to(i, e, cold)

    def __call__(self, i: int, h, logits, decode: bool, pos: int, picks=None):
        """Layer i's routed experts of h [T, D] -> [T, D] (the tier's array kind)."""
        tier = self.tier
        ids, weights, hit = self.route(i, logits, decode, pos, picks)
        n_hit = int(hit.sum())
        if n_hit == hit.size:
            y = tier.experts(i, h, ids, weights)
            self.prefetch(i)
            return y
        if not decode and h.shape[0] >= PREFILL_OFFLOAD_MIN_T and tier.stage_n:
            # a prompt: the misses run on the tier from its staging slots (uploading an
            # expert's bytes once beats the pool's compute-bound pass over many tokens). The
            # resident picks are launched first, so that the card computes them while the host
            # gathers the missed experts' bytes into pinned memory; the sum is staged + resident
            res = np.where(hit, ids, -1)
            yd = tier.experts(i, h, res, weights) if n_hit else None
            miss = np.where(hit, -1, ids)
            if self._prefetch_to is not None and self._swaps:
                # a card admits the prompt's experts from their staging slots (on the card)
                y = tier.experts_staged(i, h, miss, weights, admits=self._swaps)
                self._swaps = []
            else:
                y = tier.experts_staged(i, h, miss, weights)
            self.stats.offloaded += hit.size - n_hit
            if n_hit:
                y = y + yd
            self.prefetch(i)
            return y
        # misses: x rows go host-ward once (before the resident launches, which a GPU tier then
        # runs while the pool computes), the pool's sum comes back to the tier's device
        hh = self._to_host(h)
        yd = tier.experts(i, h, np.where(hit, ids, -1), weights) if n_hit else None
        miss = np.where(hit, -1, ids)
        yc = None
        if decode and self.split is not None:
            # the card's share of the misses over PCIe, launched before the pool takes the rest
            # (and before the admits' uploads, which its staging copy would wait for)
            yc, miss = self.split.launch(i, h, miss, weights)
        self.prefetch(i)
        if yc is not None:
            yd = yc if yd is None else yd + yc
        if decode and self.split is not None:
            y = self.split.pool(self.miss_runner.experts, i, hh, miss, weights)
        else:
            y = self.miss_runner.experts(i, hh, miss, weights)
        if self._to_device is not None:
            y = self._to_device(y)
        if yd is not None:
            y = y + yd
        return y
