"""The picks the primary misses, split between helper cards and the CPU pool.

`TieredMissRunner` is the engine's miss runner where helper cards exist: of a layer's missed
picks, those a helper holds (`TierMap`) go to that helper (launched first, computed on its card
while the pool runs), the rest to the CPU pool; the sums meet on the host. `rebalance` carries
the adaptive policy's moves to the helpers' slots (strata/routing/tiers.py). It counts each
helper's hits and the pool's distinct experts per decode layer-window.

T = tokens, K = picks per token, D = hidden, L = layers, E = experts.
"""

from __future__ import annotations

import numpy as np

from strata.engine.stats import EngineStats
from strata.routing.profile import AdaptiveCache
from strata.routing.tiers import CPU, TierMap, pick_tiers


class TieredMissRunner:
    """Misses to the helpers holding them, the rest to `pool` (the CPU pool's miss runner)."""

    name = "tiered"

    def __init__(self, pool, helpers: list, tiers: TierMap):
        self.pool, self.helpers, self.tiers = pool, helpers, tiers
        self.stats = EngineStats()  # the engine's, once `bind` gives them
        self.decode = False  # whether the current layer is a decode step's (set by `rebalance`)
        self._before = None  # (layer, its tier row before this step's moves)
        self._moves: list[tuple[int, int, int, int]] = []  # uploaded after the layer's launches

    def bind(self, stats: EngineStats) -> None:
        """Count into the engine's statistics."""
        self.stats = stats
        stats.helper_hits = [0] * len(self.helpers)

    def on_gpu(self, layer: int) -> np.ndarray:
        """[E] bool: the experts of `layer` some card holds (CAR's candidates)."""
        return self.tiers.tier[layer] != CPU

    def rebalance(
        self, layer: int, ids: np.ndarray, swaps, decode: bool, adaptive: AdaptiveCache | None
    ) -> None:
        """After the primary's cache counted ids [T, K] and made `swaps` (cold, admitted): its
        evictions take the admitted experts' places, then (decode) helpers admit hot pool
        experts. The layer's picks still run where the map said before (an admitted expert
        serves from the next step, as the primary's do); the helpers' uploads follow them."""
        self._flush()
        self.decode = decode
        self._before = (layer, self.tiers.tier[layer].copy())
        self._moves = self.tiers.primary_swaps(layer, swaps)
        if decode and adaptive is not None:
            self._moves += self.tiers.observe(layer, ids, adaptive)

    def _flush(self) -> None:
        """Upload the moves of the last `rebalance` to their helpers."""
        moves, self._moves, self._before = self._moves, [], None
        for d, i, evicted, admitted in moves:
            self.helpers[d - 1].swap(i, evicted, admitted)

    def new_window(self) -> None:
        self.tiers.new_window()

    def experts(self, layer: int, h, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Σ_k weights · expert(h) over ids >= 0 ([T, K]) -> [T, D] on the host."""
        before = self._before
        row = before[1] if before is not None and before[0] == layer else self.tiers.tier[layer]
        where = pick_tiers(ids, row)  # [T, K]
        started = []
        for d, helper in enumerate(self.helpers, 1):
            mine = where == d
            if mine.any():
                helper.launch(layer, h, np.where(mine, ids, -1), weights)
                started.append(helper)
                self.stats.helper_hits[d - 1] += int(mine.sum())
        rest = np.where((ids >= 0) & (where <= 0), ids, -1)  # CPU (or a primary's pick: none)
        n_cpu = np.unique(rest[rest >= 0]).size
        if self.decode:
            self.stats.cpu_windows += 1
            self.stats.cpu_experts += n_cpu
        if n_cpu:
            y = np.array(self.pool.experts(layer, h, rest, weights), np.float32)
        else:
            y = np.zeros((np.shape(h)[0], np.shape(h)[1]), np.float32)
        for helper in started:
            y += helper.collect()
        self._flush()
        return y
