"""The PCIe link as a third source for a decode step's missed experts: per layer window, some of
the missed experts are gathered into the card's pinned staging, uploaded and computed there
(`experts_staged`) while the CPU pool computes the rest, so that both finish together.

The rule (`pcie_count`): with n missed experts of one layer (equal sizes), p the pool's seconds
an expert (its running clock, `PoolClock`), g the host's seconds gathering one into pinned
memory and l the link's (both measured once at startup on the card, strata/gpu/link.py), k of
them uploaded finish the host at k·g + (n - k)·p (the gather runs before the pool) and the card
at k·(g + l); the k that minimizes the later of the two. The link helps only where g < p.

N = missed picks of the window, K = experts per token.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

# the pool clock's smoothing: the weight of the newest window
POOL_EWMA = 0.1


def pcie_count(n: int, pool_s: float, gather_s: float, link_s: float, most: int) -> int:
    """How many of n missed experts go over the link (at most `most`): the k in 0..min(n, most)
    minimizing max(k·g + (n - k)·p, k·(g + l)), the fewest uploads among equals.

    The host's finish falls with k (where g < p) and the card's rises, so the best k is a
    neighbour of where they cross, k* = n·p / (p + l)."""
    most = min(n, most)
    if most <= 0 or not pool_s > gather_s:
        return 0
    kx = n * pool_s / (pool_s + link_s)
    best, cost = 0, n * pool_s
    for k in (math.floor(kx), math.ceil(kx)):
        k = min(max(k, 0), most)
        c = max(k * gather_s + (n - k) * pool_s, k * (gather_s + link_s))
        if c < cost or (c == cost and k < best):
            best, cost = k, c
    return best


def pcie_count_reference(n: int, pool_s: float, gather_s: float, link_s: float, most: int):
    """`pcie_count` by trying every k (NumPy)."""
    k = np.arange(min(n, max(most, 0)) + 1)
    finish = np.maximum(k * gather_s + (n - k) * pool_s, k * (gather_s + link_s))
    return int(np.argmin(finish))


@dataclass
class PoolClock:
    """The CPU pool's seconds per missed expert in decode windows, smoothed (None: not yet
    measured; the first windows go to the pool whole)."""

    s_per_expert: float | None = None

    def add(self, seconds: float, n_experts: int) -> None:
        if n_experts <= 0:
            return
        s = seconds / n_experts
        old = self.s_per_expert
        self.s_per_expert = s if old is None else old + POOL_EWMA * (s - old)


class PcieSplit:
    """A card tier's decode misses split between its staging slots (over the link) and the
    pool. `link`: (gather, link) seconds per byte of one expert's bytes, measured at startup."""

    def __init__(self, tier, link: tuple[float, float], stats):
        self.tier, self.stats = tier, stats
        self.gather_s_per_byte, self.link_s_per_byte = link
        self.clock = PoolClock()
        # bytes of one expert a layer (its three matrices, as the staging slots hold them)
        self.expert_bytes = tier.expert_bytes_per_layer()

    def card_share(self, layer: int, ex: np.ndarray) -> np.ndarray | None:
        """Of the window's distinct missed experts ex (ascending), those to run on the card, or
        None for none (the pool takes them all)."""
        p = self.clock.s_per_expert
        if p is None:
            return None
        b = self.expert_bytes[layer]
        k = pcie_count(
            ex.size, p, b * self.gather_s_per_byte, b * self.link_s_per_byte, self.tier.stage_n
        )
        return ex[ex.size - k :] if k else None

    def launch(self, layer: int, h, miss: np.ndarray, weights: np.ndarray):
        """Upload and launch the card's share of miss [1, K] -> (the card's sum [1, D] or None,
        the picks left to the pool [1, K])."""
        st = self.stats
        st.split_windows += 1
        ex = np.unique(miss[miss >= 0])
        share = self.card_share(layer, ex)
        n_miss = int(ex.size)
        if share is None:
            st.split_pool += n_miss
            return None, miss
        on_card = np.isin(miss, share)
        y = self.tier.experts_staged(layer, h, np.where(on_card, miss, -1), weights)
        st.split_pcie += int(share.size)
        st.split_pool += n_miss - int(share.size)
        return y, np.where(on_card, -1, miss)

    def pool(self, run, layer: int, hh, miss: np.ndarray, weights: np.ndarray):
        """run(layer, hh, miss, weights) (the pool) timed into the clock."""
        t0 = time.perf_counter()
        y = run(layer, hh, miss, weights)
        self.clock.add(time.perf_counter() - t0, int(np.unique(miss[miss >= 0]).size))
        return y
