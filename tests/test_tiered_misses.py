"""The misses split between helper cards and the CPU pool (strata/engine/helpers.py), without a
GPU: stand-in runners whose sums are exact, so the split must give the pool's sum exactly."""

from __future__ import annotations

import numpy as np

from strata.engine.helpers import TieredMissRunner
from strata.engine.stats import EngineStats
from strata.routing.profile import AdaptiveCache
from strata.routing.tiers import PRIMARY, TierMap, place_tiers

D = 4


def _expert_sum(layer, h, ids, w) -> np.ndarray:
    """Σ_k w · expert(h), expert e of a layer being h * (e + 1 + layer) (exact in float64)."""
    f = np.where(ids >= 0, ids + 1 + layer, 0) * w  # [T, K]
    return (np.asarray(h, np.float64) * f.sum(axis=1)[:, None]).astype(np.float32)


class Pool:
    def __init__(self):
        self.seen = []

    def experts(self, layer, h, ids, w):
        self.seen.append(np.asarray(ids).copy())
        return _expert_sum(layer, h, ids, w)


class Helper:
    def __init__(self, held):
        self.held, self.launched, self.swaps, self._y = held, [], [], None

    def launch(self, layer, h, ids, w):
        assert all(self.held[layer, e] for e in ids[ids >= 0])  # only what it holds
        self.launched.append(np.asarray(ids).copy())
        self._y = _expert_sum(layer, h, ids, w)

    def collect(self):
        y, self._y = self._y, None
        return y

    def swap(self, layer, evicted, admitted):
        assert self._y is None  # never while a launch is in flight
        self.held[layer, evicted], self.held[layer, admitted] = False, True
        self.swaps.append((layer, evicted, admitted))


def test_each_pick_runs_where_the_map_says_and_the_sum_is_the_pools_alone():
    g = np.random.default_rng(53)
    tier = place_tiers(g.integers(0, 50, (2, 16)), [4, 5, 3])
    helpers = [Helper(tier == d) for d in (1, 2)]
    pool = Pool()
    runner = TieredMissRunner(pool, helpers, TierMap(tier, 2))
    stats = EngineStats()
    runner.bind(stats)
    for layer in (0, 1):
        ids = np.stack([g.permutation(16)[:4] for _ in range(3)]).astype(np.int32)  # [T, K]
        ids[tier[layer][ids] == PRIMARY] = -1  # the primary's hits never reach the runner
        h = g.standard_normal((3, D)).astype(np.float32)
        w = g.random((3, 4)).astype(np.float32)
        runner.rebalance(layer, ids, [], True, None)
        got = runner.experts(layer, h, ids, w)
        np.testing.assert_allclose(got, _expert_sum(layer, h, ids, w), rtol=1e-6)
        assert (tier[layer][pool.seen[-1][pool.seen[-1] >= 0]] == -1).all()
    hits = [sum(int((a >= 0).sum()) for a in hp.launched) for hp in helpers]
    assert stats.helper_hits == hits and sum(hits) > 0
    assert stats.cpu_windows == 2 and stats.cpu_experts_per_window() > 0


def test_a_layers_picks_run_where_they_were_and_the_moves_follow_them():
    """The primary admits helper 1's expert 2 (its cold expert 0 takes the slot): this step's
    pick of 2 still runs on helper 1, the upload comes after."""
    tier = np.array([[0, 0, 1, 1, -1, -1]], np.int8)
    helper = Helper(tier == 1)
    pool = Pool()
    runner = TieredMissRunner(pool, [helper], TierMap(tier, 1))
    runner.bind(EngineStats())
    cache = AdaptiveCache(tier == PRIMARY)
    ids = np.array([[2, 4]], np.int32)
    runner.rebalance(0, ids, [(0, 2)], True, cache)
    assert tier.tolist() == [[1, 0, 0, 1, -1, -1]] and helper.swaps == []
    h = np.ones((1, D), np.float32)
    w = np.array([[0.5, 0.25]], np.float32)
    np.testing.assert_allclose(runner.experts(0, h, ids, w), _expert_sum(0, h, ids, w))
    assert helper.launched[0].tolist() == [[2, -1]] and pool.seen[0].tolist() == [[-1, 4]]
    assert helper.swaps == [(0, 2, 0)] and helper.held[0].tolist() == [1, 0, 0, 1, 0, 0]
