"""The routed-plan record: one token's plan for one layer, as the card's routing writes it and the
host (the engine, the CPU pool's step server) reads it. Defined here once, beside the block
formats, because it too is a layout both tiers share.

A record is R = 4 K + 4 + D 32-bit words (K = picks a token, D = hidden):

    ids0 [K] i32       the router's picks
    ids [K] i32        after cache-aware routing
    weights [K] f32    the router weights (a substitute keeps the weight of the pick it replaces)
    pair_slot [K] i32  the resident slot of each pick, -1: the CPU pool's
    stats [4] f32      misses before CAR, substitutions, misses after CAR, sum of the ratios
    h [D] f32          ffn_norm(x): the pool's input row

The routing kernel (`strata/gpu/kernels/route_car.cu`) writes the same layout.
"""

from __future__ import annotations

import numpy as np

# stats words, in order
ST_BEFORE, ST_SUBST, ST_AFTER, ST_RATIO = range(4)
N_STATS = 4

# what the CPU pool's step server (StepServer.run) returns with the layer it stopped at: the step
# is done; a ready word waited on too long; an expert to copy to RAM first; the pool's team fell
# back; a record with an expert id out of range
DONE, WAIT, FILL, BARRIER, BAD_ID = range(5)


def offsets(k: int) -> tuple[int, int, int, int, int, int]:
    """Word offsets of ids0, ids, weights, pair_slot, stats, h in a record with K = k."""
    return 0, k, 2 * k, 3 * k, 4 * k, 4 * k + N_STATS


def words(k: int, d: int) -> int:
    """32-bit words of one record."""
    return 4 * k + N_STATS + d


def record_views(recs: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """Named views of uint32 records recs [L, R]: ids0, ids, weights, pair_slot [L, K],
    stats [L, 4], h [L, D]."""
    ri, rf = recs.view(np.int32), recs.view(np.float32)
    o_ids0, o_ids, o_w, o_slot, o_st, o_h = offsets(k)
    return {
        "ids0": ri[:, o_ids0:o_ids],
        "ids": ri[:, o_ids:o_w],
        "weights": rf[:, o_w:o_slot],
        "pair_slot": ri[:, o_slot:o_st],
        "stats": rf[:, o_st:o_h],
        "h": rf[:, o_h:],
    }


def plan_views(rec: np.ndarray, k: int) -> dict[str, np.ndarray]:
    """Named views of one uint32 record rec [R]: ids0, ids, weights, pair_slot [K], stats [4],
    h [1, D] (the pool's input, one row)."""
    v = {name: a[0] for name, a in record_views(rec[None], k).items()}
    v["h"] = v["h"][None]
    return v
