"""The host side of a prompt's grouped expert launches, compiled (per layer, between the card's
router read-back and the experts' launches, so the card waits on it): the distinct experts of a
layer's picks, and `experts.group_pairs`'s tiles by a counting sort over the slots, written into
one int32 array the launcher copies to the card at once. Each gives exactly its NumPy rule's
arrays (tests/test_gpu_grouping.py).

T = tokens, K = picks per token, P = T*K pairs, E = experts.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _distinct(ids, n_expert):
    seen = np.zeros(n_expert, np.bool_)
    for v in ids.ravel():
        if v >= 0:
            seen[v] = True
    return np.flatnonzero(seen).astype(np.int64)


def distinct_experts(ids: np.ndarray, n_expert: int) -> np.ndarray:
    """`np.unique(ids[ids >= 0])` for expert ids [T, K] below n_expert (int64, ascending)."""
    return _distinct(np.ascontiguousarray(ids), n_expert)


@njit(cache=True)
def _group(flat, nt, out):
    p = flat.size
    smax = -1
    for i in range(p):
        smax = max(smax, flat[i])
    if smax < 0:
        return 0, 0
    start = np.zeros(smax + 2, np.int64)  # start[s]: where slot s's pairs begin in the order
    for i in range(p):
        if flat[i] >= 0:
            start[flat[i] + 1] += 1
    for s in range(smax + 1):
        start[s + 1] += start[s]
    fill = start.copy()
    for i in range(p):  # stable: pairs of a slot keep their order
        s = flat[i]
        if s >= 0:
            out[0, fill[s]] = i
            fill[s] += 1
    n_tiles = 0
    for s in range(smax + 1):
        j = start[s]
        while j < start[s + 1]:  # a run of slot s in tiles of up to nt pairs
            out[1, n_tiles] = s
            out[2, n_tiles] = j
            out[3, n_tiles] = min(nt, start[s + 1] - j)
            n_tiles += 1
            j += nt
    return start[smax + 1], n_tiles


def group_pairs_into(slots: np.ndarray, nt: int, out: np.ndarray) -> tuple[int, int]:
    """`group_pairs(slots, nt)` written into out [4, >= P] int32: rows pair_order, tile_slot,
    tile_first, tile_n (their first m and n_tiles entries) -> (m, n_tiles)."""
    flat = np.ascontiguousarray(slots, dtype=np.int32).reshape(-1)
    if out.shape[0] != 4 or out.shape[1] < flat.size or out.dtype != np.int32:
        raise ValueError(f"group_pairs_into: out must be int32 [4, >= {flat.size}]")
    m, n_tiles = _group(flat, nt, out)
    return int(m), int(n_tiles)
