"""Usage profiles and cache placement.

A profile is per-layer expert pick counts from real traffic ([L, E]); placement fills a given
number of cache slots by profile rank across all layers. `AdaptiveCache` keeps a frequency
estimate during decode and proposes swaps (hot miss in, cold resident out), at most `max_swaps`
per request window; `observe_fast` / `observe_step` are `AdaptiveCache.observe` compiled (the
same scores, mask, counters and swaps) for the decode path.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import njit

PROFILE_VERSION = 1


@dataclass
class UsageProfile:
    counts: np.ndarray  # [L, E] int64
    model_id: str = ""
    tokens: int = 0

    def save(self, path: str | os.PathLike) -> None:
        doc = {
            "version": PROFILE_VERSION,
            "model": self.model_id,
            "tokens": self.tokens,
            "counts": self.counts.tolist(),
        }
        tmp = Path(str(path) + ".partial")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

    @classmethod
    def load(
        cls, path: str | os.PathLike, n_layer: int | None = None, n_expert: int | None = None
    ) -> UsageProfile:
        doc = json.loads(Path(path).read_text())
        if doc.get("version") != PROFILE_VERSION:
            raise ValueError(f"{path}: profile version {doc.get('version')} is not supported")
        counts = np.asarray(doc["counts"], dtype=np.int64)
        if n_layer is not None and counts.shape != (n_layer, n_expert):
            raise ValueError(
                f"{path}: profile is for {counts.shape[0]} layers x "
                f"{counts.shape[1]} experts, the model has {n_layer} x {n_expert}"
            )
        return cls(counts, doc.get("model", ""), int(doc.get("tokens", 0)))


def place(counts: np.ndarray, n_slots: int) -> np.ndarray:
    """Resident mask [L, E]: the `n_slots` most-used (layer, expert) pairs (ties: lower layer,
    then lower expert id)."""
    n_layer, n_expert = counts.shape
    n_slots = max(0, min(n_slots, counts.size))
    flat = counts.reshape(-1)
    order = np.lexsort((np.arange(flat.size), -flat))  # by count desc, then flat index
    mask = np.zeros(flat.size, dtype=bool)
    mask[order[:n_slots]] = True
    return mask.reshape(n_layer, n_expert)


def usage_entropy(counts: np.ndarray) -> float:
    """Normalized entropy of one layer's expert usage counts [E] in [0, 1] (1: uniform), with
    the Miller-Madow correction for the picks seen, so a few hundred tokens estimate the
    router's own distribution rather than the sample's."""
    counts = np.asarray(counts, np.float64)
    n, e = counts.sum(), counts.size
    if n <= 0 or e < 2:
        return 0.0
    p = counts[counts > 0] / n
    h = -(p * np.log(p)).sum() + (p.size - 1) / (2 * n)
    return float(min(1.0, h / np.log(e)))


@dataclass
class AdaptiveCache:
    """Frequency-aware admission/eviction over a fixed resident set (no size change).

    Each pick adds 1 to its (layer, expert) score, scores decay by `decay` per token. A missed
    expert is admitted when its score exceeds the coldest resident's of the same layer by
    `margin`, at most `max_swaps` per window (0 = static cache).
    """

    resident: np.ndarray  # [L, E] bool (modified in place)
    max_swaps: int = 96
    decay: float = 0.98
    margin: float = 1.0
    # a prompt's picks re-place the cache before its decode (`warm`); off where a usage
    # profile placed it (a profile of real traffic is the better start)
    warm_from_prompts: bool = True
    score: np.ndarray = field(init=False)
    swaps_in_window: int = 0
    swaps_total: int = 0

    def __post_init__(self) -> None:
        self.score = self.resident.astype(np.float64)  # residents start warm

    def new_window(self) -> None:
        self.swaps_in_window = 0

    def warm(self, layer: int, ids: np.ndarray) -> list[tuple[int, int]]:
        """A prompt's picks of one layer ([T, K], T > 1) -> the swaps made (evicted, admitted).

        The picks are counted as decode counts them (scores decayed by T tokens), but at the
        rate a decode step would see them (x 1/(T (1 - decay)) where that is below 1: a long
        prompt's counts become the steady-state score of its rates, so the decode's own picks
        move them at once). Then the hottest missed experts take the coldest residents' slots,
        pair by pair, while one beats the other by `margin`: every upload is one the prompt
        asked for, however many. Not bounded by `max_swaps` (the decode's churn per request)."""
        t = ids.shape[0]
        s = self.score[layer]
        s *= self.decay**t
        np.add.at(s, ids.ravel(), min(1.0, 1.0 / (t * (1.0 - self.decay))))
        res = self.resident[layer]
        missed = np.flatnonzero(~res)
        missed = missed[np.argsort(-s[missed], kind="stable")]  # hottest first
        held = np.flatnonzero(res)
        held = held[np.argsort(s[held], kind="stable")]  # coldest first
        n = min(missed.size, held.size)
        beats = s[missed[:n]] > s[held[:n]] + self.margin
        n = int(np.argmin(beats)) if not beats.all() else n  # the pairs while one beats the other
        res[held[:n]] = False
        res[missed[:n]] = True
        self.swaps_total += n
        return [(int(c), int(e)) for c, e in zip(held[:n], missed[:n], strict=True)]

    def observe(self, layer: int, ids: np.ndarray) -> list[tuple[int, int]]:
        """Count the picks of one layer ([T, K]); returns the swaps made as (evicted, admitted)."""
        s = self.score[layer]
        s *= self.decay ** ids.shape[0]
        np.add.at(s, ids.ravel(), 1.0)
        swaps: list[tuple[int, int]] = []
        if self.max_swaps == 0:
            return swaps
        res = self.resident[layer]
        for e in np.unique(ids[~res[ids]]):
            if self.swaps_in_window >= self.max_swaps or not res.any():
                break
            residents = np.flatnonzero(res)
            cold = int(residents[np.argmin(s[residents])])
            if s[e] > s[cold] + self.margin:
                res[cold], res[e] = False, True
                swaps.append((cold, int(e)))
                self.swaps_in_window += 1
                self.swaps_total += 1
        return swaps


@njit(cache=True)
def _observe(s, res, ids, factor, margin, room, swaps):
    """AdaptiveCache.observe's arithmetic on one layer's score s [E] f64 and resident mask res
    [E] (both in place): the decay, the counts, then up to `room` swaps into swaps [., 2]
    (evicted, admitted); returns how many (room < 0: counting only)."""
    e_n = s.shape[0]
    for i in range(e_n):
        s[i] *= factor
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            s[ids[t, k]] += 1.0
    if room < 0:
        return 0
    missed = np.zeros(e_n, np.bool_)  # np.unique(ids[~res[ids]]), ascending, taken up front
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            if not res[ids[t, k]]:
                missed[ids[t, k]] = True
    n = 0
    for e in range(e_n):
        if not missed[e]:
            continue
        cold = -1
        for c in range(e_n):  # the first resident with the least score
            if res[c] and (cold < 0 or s[c] < s[cold]):
                cold = c
        if n >= room or cold < 0:
            break
        if s[e] > s[cold] + margin:
            res[cold] = False
            res[e] = True
            swaps[n, 0] = cold
            swaps[n, 1] = e
            n += 1
    return n


def observe_fast(cache: AdaptiveCache, layer: int, ids: np.ndarray) -> list[tuple[int, int]]:
    """`cache.observe(layer, ids)` (the same scores, mask, counters and swaps), compiled."""
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    room = cache.max_swaps - cache.swaps_in_window if cache.max_swaps else -1
    swaps = np.empty((max(room, 0), 2), np.int64)
    factor = cache.decay ** ids.shape[0]
    n = _observe(cache.score[layer], cache.resident[layer], ids, factor, cache.margin, room, swaps)
    cache.swaps_in_window += n
    cache.swaps_total += n
    return [(int(a), int(b)) for a, b in swaps[:n]]


@njit(cache=True)
def _observe_layers(score, res, ids, factor, margin, room, swaps):
    """`_observe` of layers 0..L-1 in order on one step's picks ids [L, K] (a token a layer),
    the swap room shared as the calls one after another share it; swaps [., 3] (layer, evicted,
    admitted); returns how many."""
    n = 0
    for layer in range(ids.shape[0]):
        r = room - n if room >= 0 else -1
        m = _observe(score[layer], res[layer], ids[layer : layer + 1], factor, margin, r,
                     swaps[n:, 1:])  # fmt: skip
        for j in range(n, n + m):
            swaps[j, 0] = layer
        n += m
    return n


def observe_step(cache: AdaptiveCache, ids: np.ndarray) -> list[tuple[int, int, int]]:
    """`cache.observe(i, ids[i : i + 1])` for every layer i of one decode step's router picks
    ids [L, K], in one compiled call -> the swaps as (layer, evicted, admitted)."""
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    room = cache.max_swaps - cache.swaps_in_window if cache.max_swaps else -1
    swaps = np.empty((max(room, 0), 3), np.int64)
    n = _observe_layers(cache.score, cache.resident, ids, cache.decay, cache.margin, room, swaps)
    cache.swaps_in_window += n
    cache.swaps_total += n
    return [(int(a), int(b), int(c)) for a, b, c in swaps[:n]]
