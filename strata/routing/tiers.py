"""Expert placement across tiers: the primary card, helper cards, the CPU pool.

`tier` [L, E] int8 names where each expert lives: PRIMARY (0), helper d (1..H) or CPU (-1); one
array, so no expert is ever held twice. `place_tiers` fills the tiers from a usage profile, the
hottest on the primary, the next on helper 1, then helper 2, ... up to each tier's slot count,
the rest to the CPU pool. `TierMap` keeps the map under one adaptive policy: the primary's
`AdaptiveCache` (its scores and swaps unchanged) admits the hottest misses from any tier, an
expert it evicts takes the admitted one's place (a helper's slot or the pool), and a helper admits
a hot pool expert in place of its coldest one of the layer, by the same scores and margin, within
the same swap room a window. Each tier keeps its count of experts per layer. `pick_tiers` is a
layer's per-pick plan.

L = layers, E = experts, T = tokens, K = picks per token, H = helpers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CPU = -1
PRIMARY = 0


def default_counts(n_layer: int, n_expert: int) -> np.ndarray:
    """Pseudo counts [L, E] for placement without a profile: expert j of layer i ranks j*L + i,
    so the first N places give every layer an equal share of its lowest ids (build's
    `resident_mask`), and the next places continue the same way."""
    j, i = np.meshgrid(np.arange(n_expert), np.arange(n_layer))  # [L, E] each
    return -(j * n_layer + i).astype(np.int64)


def place_tiers(counts: np.ndarray, slots: Sequence[int]) -> np.ndarray:
    """tier [L, E] int8 from counts [L, E]: the slots[0] most-used (layer, expert) pairs on the
    primary, the next slots[d] on helper d, the rest CPU (ties: lower layer, then lower expert
    id, as `profile.place`)."""
    flat = np.asarray(counts).reshape(-1)
    order = np.lexsort((np.arange(flat.size), -flat))  # by count desc, then flat index
    tier = np.full(flat.size, CPU, np.int8)
    start = 0
    for d, n in enumerate(slots):
        n = max(0, min(int(n), flat.size - start))
        tier[order[start : start + n]] = d
        start += n
    return tier.reshape(np.shape(counts))


def pick_tiers(ids: np.ndarray, tier_row: np.ndarray) -> np.ndarray:
    """A layer's plan: ids [T, K] -> where each pick runs [T, K] int8 (PRIMARY, helper d, CPU);
    ids < 0 (no pick) read CPU."""
    ids = np.asarray(ids)
    return np.where(ids >= 0, tier_row[np.maximum(ids, 0)], CPU).astype(np.int8)


@dataclass
class TierMap:
    """Where each expert lives, under one adaptive policy (module docstring): the primary's
    `AdaptiveCache` scores every expert, and helper admits share its margin and its swap room
    a window (`max_swaps`, `swaps_in_window`).

    Moves are (helper d, layer, evicted, admitted): helper d's slot of `evicted` now holds
    `admitted`."""

    tier: np.ndarray  # [L, E] int8 (modified in place)
    n_helpers: int
    moves_total: int = 0

    def held(self, d: int) -> np.ndarray:
        """[L, E] bool: the experts tier d holds."""
        return self.tier == d

    def primary_swaps(self, layer: int, swaps) -> list[tuple[int, int, int, int]]:
        """The primary admitted e in place of cold (swaps (cold, e), already applied to its
        resident mask): cold takes e's place -> the helpers' moves."""
        row = self.tier[layer]
        moves = []
        for cold, e in swaps:
            old = int(row[e])
            row[e], row[cold] = PRIMARY, old if old > PRIMARY else CPU
            if old > PRIMARY:
                moves.append((old, layer, int(e), int(cold)))
        self.moves_total += len(moves)
        return moves

    def observe(self, layer: int, ids: np.ndarray, cache) -> list[tuple[int, int, int, int]]:
        """A layer's picks ids [T, K] after the primary's `cache` (an AdaptiveCache) counted
        them: pool experts picked (ascending) that beat a helper's coldest expert of the layer
        by the cache's margin take its slot (helper 1 tried first), within the cache's swap
        room of the window -> the moves."""
        moves: list[tuple[int, int, int, int]] = []
        if cache.max_swaps == 0 or self.n_helpers == 0:
            return moves
        row, s = self.tier[layer], cache.score[layer]
        ids = np.asarray(ids)
        picked = np.unique(ids[ids >= 0])
        for e in picked[row[picked] == CPU]:
            if cache.swaps_in_window >= cache.max_swaps:
                break
            for d in range(1, self.n_helpers + 1):
                held = np.flatnonzero(row == d)
                if held.size == 0:
                    continue
                cold = int(held[np.argmin(s[held])])
                if s[e] > s[cold] + cache.margin:
                    row[cold], row[e] = CPU, d
                    moves.append((d, layer, cold, int(e)))
                    cache.swaps_in_window += 1
                    cache.swaps_total += 1
                    break
        self.moves_total += len(moves)
        return moves
