"""Placement across tiers (primary, helper cards, CPU pool); one adaptive policy over them."""

from __future__ import annotations

import numpy as np
import pytest

from strata.routing.profile import AdaptiveCache, observe_fast, place
from strata.routing.tiers import CPU, PRIMARY, TierMap, default_counts, pick_tiers, place_tiers


def _profile(seed: int, n_layer: int = 4, n_expert: int = 16) -> np.ndarray:
    g = np.random.default_rng(seed)
    return g.zipf(1.6, size=(n_layer, n_expert)).astype(np.int64)  # [L, E], ties likely


@pytest.mark.parametrize("seed", range(6))
def test_placement_puts_the_hottest_on_the_primary_the_next_on_helpers_the_rest_on_cpu(seed):
    counts = _profile(seed)
    g = np.random.default_rng(100 + seed)
    slots = [int(g.integers(0, 24)), int(g.integers(0, 20)), int(g.integers(0, 12))]
    tier = place_tiers(counts, slots)
    left = counts.size
    for d, n in enumerate(slots):
        assert (tier == d).sum() == min(n, left)
        left -= min(n, left)
    assert (tier == CPU).sum() == left
    # the primary is exactly profile.place's mask; every tier is hotter than the next
    assert ((tier == PRIMARY) == place(counts, slots[0])).all()
    ranked = [d for d in (0, 1, 2, CPU) if (tier == d).any()]
    for hot, cold in zip(ranked[:-1], ranked[1:], strict=True):
        assert counts[tier == hot].min() >= counts[tier == cold].max()


def test_default_counts_give_each_layer_an_equal_share_of_its_lowest_ids():
    tier = place_tiers(default_counts(3, 8), [7, 5])
    assert (tier == PRIMARY).sum(axis=1).tolist() == [3, 2, 2]
    assert (tier == 1).sum(axis=1).tolist() == [1, 2, 2]
    for i in range(3):  # the primary's ids first, then the helper's, then the pool's
        row = tier[i].astype(int)
        row[row == CPU] = 9
        assert (np.diff(row) >= 0).all()


def test_the_plan_names_each_picks_tier():
    tier_row = np.array([0, 1, -1, 2, 0], np.int8)
    ids = np.array([[0, 1], [2, 3], [4, -1]])
    assert pick_tiers(ids, tier_row).tolist() == [[0, 1], [-1, 2], [0, -1]]


@pytest.mark.parametrize("seed", range(4))
def test_one_adaptive_policy_keeps_tiers_disjoint_and_their_sizes(seed):
    """Random traffic: the primary's cache swaps as it does alone, its evictions take the
    admitted experts' places, helpers admit hot pool experts; each tier keeps its per-layer
    counts, and the primary's mask is always the map's tier 0."""
    g = np.random.default_rng(seed)
    n_layer, n_expert, k = 3, 16, 4
    tier = place_tiers(_profile(seed, n_layer, n_expert), [12, 9, 6])
    per_layer = [(tier == d).sum(axis=1) for d in (0, 1, 2)]
    resident = tier == PRIMARY
    alone = AdaptiveCache(resident.copy(), max_swaps=5, margin=0.5)
    cache = AdaptiveCache(resident, max_swaps=5, margin=0.5)
    tiers = TierMap(tier, n_helpers=2)
    hot = g.permutation(n_expert)[:6]  # traffic the placement did not foresee
    moves = 0
    for step in range(60):
        if step % 10 == 0:
            cache.new_window(), alone.new_window()
        for i in range(n_layer):
            ids = np.stack([g.choice(np.r_[hot, g.integers(0, n_expert, 2)], k, replace=False)])
            swaps = observe_fast(cache, i, ids)
            assert swaps == observe_fast(alone, i, ids)  # helpers do not change the primary
            # the moves replayed on each helper's slots give the map's helpers exactly
            held = {d: set(np.flatnonzero(tier[i] == d).tolist()) for d in (1, 2)}
            for d, li, out, inn in tiers.primary_swaps(i, swaps) + tiers.observe(i, ids, cache):
                assert li == i and out in held[d] and inn not in held[d]
                held[d] = (held[d] - {out}) | {inn}
                moves += 1
            for d in (1, 2):
                assert held[d] == set(np.flatnonzero(tier[i] == d).tolist())
            alone.swaps_in_window = cache.swaps_in_window  # the room helpers took
            assert ((tier == PRIMARY) == resident).all()
            for d in (0, 1, 2):
                assert ((tier == d).sum(axis=1) == per_layer[d]).all()
    assert moves and cache.swaps_total <= 30  # 6 windows of at most 5, every tier's swaps


def test_a_helper_admits_a_hot_pool_expert_in_place_of_its_coldest():
    tier = np.array([[0, 0, 1, 1, -1, -1]], np.int8)
    cache = AdaptiveCache(tier == PRIMARY, margin=1.0)
    cache.score[0] = [5.0, 5.0, 3.0, 0.5, 2.0, 0.1]
    tiers = TierMap(tier, n_helpers=1)
    assert tiers.observe(0, np.array([[4, 5]]), cache) == [(1, 0, 3, 4)]
    assert tier.tolist() == [[0, 0, 1, -1, 1, -1]] and cache.swaps_in_window == 1
    static = AdaptiveCache(tier == PRIMARY, max_swaps=0)
    static.score[:] = 9
    assert TierMap(tier.copy(), n_helpers=1).observe(0, np.array([[5]]), static) == []


def test_an_expert_the_primary_admits_from_a_helper_swaps_places_with_the_evicted():
    tier = np.array([[0, 1, -1]], np.int8)
    tiers = TierMap(tier, n_helpers=1)
    assert tiers.primary_swaps(0, [(0, 1)]) == [(1, 0, 1, 0)]
    assert tier.tolist() == [[1, 0, -1]]
    assert tiers.primary_swaps(0, [(1, 2)]) == []  # from the pool: the evicted goes there
    assert tier.tolist() == [[1, -1, 0]]
