"""The host's per-layer routing on the decode path, compiled where NumPy's per-call overhead
is the cost: the top-k selection of `strata.routing.topk.route_topk` (T = 1), the adaptive
cache's `observe`, the router-pick histogram. Each gives the identical result of its rule of
record (strata/routing stays pure NumPy; tests hold the twins equal on random and tied inputs).

On a hybrid decode step the host routes between the card's two graphs of every layer, so these
microseconds sit on the critical path 48 times a token (2-vCPU dev VM, E = 128, K = 8, a layer:
route_topk 35-56 us, observe 11 us, np.add.at 2.6-2.9 us; the twins 15-18, 3.7-3.9 and 0.35 us;
bench/results/route-fast-2core-20261130.md).
T = tokens, E = experts, K = picks per token.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.routing.profile import AdaptiveCache
from strata.routing.topk import MIN_WEIGHT_SUM, route_topk, softmax


@njit(cache=True)
def _select(p, k, ids):
    """ids [K] = the K experts of p [E] by probability, highest first, equal ones lower id
    first (`np.argsort(-p, kind="stable")[:K]`, which route_topk's selection equals)."""
    e = p.shape[0]
    n = 0
    for c in range(e):  # insertion into the sorted best-K list
        v = p[c]
        if n == k and not v > p[ids[k - 1]]:
            continue
        j = n if n < k else k - 1
        while j > 0 and v > p[ids[j - 1]]:
            if j < k:
                ids[j] = ids[j - 1]
            j -= 1
        ids[j] = c
        if n < k:
            n += 1


@njit(cache=True)
def _select_rows(probs, k, ids):
    """`_select` of every row: probs [T, E] -> ids [T, K]."""
    for t in range(probs.shape[0]):
        _select(probs[t], k, ids[t])


def topk_fast(
    logits: np.ndarray, k: int, renormalize: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`route_topk` (the same arrays, bit for bit): the selection runs compiled (a prompt's
    T rows too: NumPy's sorts cost ~3 ms a 512-token layer); the softmax and the
    renormalization stay NumPy's (their float order is NumPy's)."""
    if k > logits.shape[1] or k < 1:
        return route_topk(logits, k, renormalize)
    probs = softmax(logits.astype(np.float32, copy=False))  # [T, E]
    if probs.shape[0] == 1:  # decode
        p = probs[0]
        ids1 = np.empty(k, np.int32)
        _select(p, k, ids1)
        w = p[ids1]
        if renormalize:
            w = w / np.maximum(w.sum(), MIN_WEIGHT_SUM)
        return ids1[None], w.astype(np.float32)[None], probs
    ids = np.empty((probs.shape[0], k), np.int32)
    _select_rows(probs, k, ids)
    weights = np.take_along_axis(probs, ids, axis=-1)  # [T, K]
    if renormalize:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), MIN_WEIGHT_SUM)
    return ids, weights.astype(np.float32), probs


@njit(cache=True)
def count_picks(hist_row, ids):
    """hist_row[e] += 1 for every pick e in ids [T, K] (np.add.at's counts)."""
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            hist_row[ids[t, k]] += 1


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
