"""A prompt chunk's (token, expert) pairs grouped into the grouped expert kernels' tiles on the
card (kernels/group_pairs.cu): launcher and NumPy reference. The router's picks stay on the
device, so a layer whose experts are all resident needs no read-back between its router and its
experts (the host's grouping, `pairs_fast.group_pairs_into`, sorts by slot from host picks).

T = tokens, K = picks per token, P = T*K pairs, E = experts, nt = pairs a tile.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.rawmod import Kernels, i32, ptr

GP_THREADS = 512  # group_pairs.cu: one block; E <= GP_THREADS


def max_tiles(p: int, e: int, nt: int) -> int:
    """An upper bound of the tiles of p pairs over e experts: sum ceil(n_e / nt) <= p / nt + the
    experts with a pair (the grouped kernels' grid; blocks past the count on the card return)."""
    return -(-p // nt) + min(e, p)


def group_pairs_ref(ids: np.ndarray, slot_row: np.ndarray, nt: int):
    """group_pairs.cu's result for ids [P] and slot_row [E]: (pair_slot [P], order [P'],
    tile_slot, tile_first, tile_n [tiles], counts [E]) int32; order = the pairs with a slot,
    stably sorted by expert id."""
    ids = np.asarray(ids, np.int64).ravel()
    slot_row = np.asarray(slot_row, np.int32)
    e = slot_row.size
    ok = (ids >= 0) & (ids < e)
    pair_slot = np.full(ids.size, -1, np.int32)
    pair_slot[ok] = slot_row[ids[ok]]
    live = np.flatnonzero(pair_slot >= 0)
    order = live[np.argsort(ids[live], kind="stable")].astype(np.int32)
    counts = np.bincount(ids[live], minlength=e).astype(np.int32)
    starts = np.cumsum(counts) - counts
    ts, tf, tn = [], [], []
    for x in range(e):
        for j in range(0, int(counts[x]), nt):
            ts.append(slot_row[x])
            tf.append(starts[x] + j)
            tn.append(min(nt, counts[x] - j))
    t = [np.asarray(v, np.int32) for v in (ts, tf, tn)]
    return pair_slot, order, *t, counts


def group_pairs(
    K: Kernels, ids, p: int, slot_row, e: int, nt: int, pair_slot, tiles, hist=None
) -> int:
    """Group the p pairs of ids [>= p] int32 (device) by expert into `tiles` (experts.TileBufs:
    order, slot, first, n and the count) and pair_slot [>= p] = slot_row[ids]; hist [E] int32
    (optional) += each expert's pairs. -> the grid's tile bound (`max_tiles`)."""
    if not 1 <= e <= GP_THREADS:
        raise ValueError(f"grouping pairs on the card takes 1..{GP_THREADS} experts, not {e}")
    if p > tiles.order.size:
        raise ValueError(f"{p} pairs exceed the tile buffers' {tiles.order.size}")
    K.fn("group_pairs.cu", "group_pairs")(
        (1,),
        (GP_THREADS,),
        (
            ids, i32(p), slot_row, i32(e), i32(nt), pair_slot, tiles.order, tiles.slot,
            tiles.first, tiles.n, tiles.count, ptr(hist),
        ),
    )  # fmt: skip
    return max_tiles(p, e, nt)
