"""`car_plan`'s rule compiled (Numba) for the decode path: the same plan, without NumPy's
per-call overhead (tens of microseconds per layer and token in pure NumPy).

strata.routing.car.car_plan stays the rule of record (pure NumPy, golden cases, offline replay);
this twin is tested to give the identical plan (ids, substituted, ratios, misses) on random and
tied inputs. T = tokens, E = experts, K = picks per token.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.routing.car import CarKnobs, CarResult

TINY = np.finfo(np.float64).tiny


@njit(cache=True)
def _plan(ids, probs, resident, threshold, budget, free_ratio, out, subst, ratios):
    """Fill out/subst/ratios [T, K] (out preset to ids); returns the misses before CAR."""
    t, k = ids.shape
    e = resident.shape[0]
    misses = 0
    for row in range(t):
        for kk in range(k):
            if not resident[ids[row, kk]]:
                misses += 1
    if misses == 0:
        return 0
    any_res = False
    for c in range(e):
        if resident[c]:
            any_res = True
            break
    if not any_res:
        return misses
    avail = np.empty(e, np.bool_)
    miss_k = np.empty(k, np.int64)
    # candidate pairs (miss slot, candidate expert, ratio): at most K * E
    pk = np.empty(k * e, np.int64)
    pc = np.empty(k * e, np.int64)
    pr = np.empty(k * e, np.float64)
    done = np.zeros(k, np.bool_)
    used = np.zeros(e, np.bool_)
    for row in range(t):
        m = 0
        for kk in range(k):
            if not resident[ids[row, kk]]:
                miss_k[m] = kk
                m += 1
        if m == 0:
            continue
        for c in range(e):
            avail[c] = resident[c]
        for kk in range(k):
            avail[ids[row, kk]] = False
        n = 0
        for j in range(m):
            kk = miss_k[j]
            pe = max(np.float64(probs[row, ids[row, kk]]), TINY)
            for c in range(e):
                if avail[c]:
                    r = np.float64(probs[row, c]) / pe
                    if r >= threshold:
                        pk[n] = kk
                        pc[n] = c
                        pr[n] = r
                        n += 1
        if n == 0:
            continue
        for kk in range(k):
            done[kk] = False
        for c in range(e):
            used[c] = False
        n_done = 0
        counted = 0
        # pairs best ratio first, ties by lower candidate id, then lower expert id of the miss
        # (three stable sorts, last key first: np.lexsort's order)
        order = np.argsort(ids[row, pk[:n]], kind="mergesort")
        order = order[np.argsort(pc[:n][order], kind="mergesort")]
        order = order[np.argsort(-pr[:n][order], kind="mergesort")]
        for best in order:
            kk, c, r = pk[best], pc[best], pr[best]
            if done[kk] or used[c]:
                continue
            free = r >= free_ratio
            if budget > 0 and not free and counted >= budget:
                continue
            out[row, kk] = c
            subst[row, kk] = True
            ratios[row, kk] = np.float32(r)
            done[kk] = True
            used[c] = True
            if not free:
                counted += 1
            n_done += 1
            if n_done == m:
                break
    return misses


def car_plan_fast(
    ids: np.ndarray, probs: np.ndarray, resident: np.ndarray, knobs: CarKnobs
) -> CarResult:
    """`strata.routing.car.car_plan`, compiled: ids [T, K], probs [T, E], resident [E] bool."""
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    out = ids.copy()
    subst = np.zeros(ids.shape, dtype=bool)
    ratios = np.zeros(ids.shape, dtype=np.float32)
    if not knobs.enabled:
        return CarResult(out, subst, ratios, int((~resident[ids]).sum()))
    misses = _plan(
        ids,
        np.ascontiguousarray(probs, dtype=np.float32),
        np.ascontiguousarray(resident, dtype=np.bool_),
        float(knobs.threshold),
        int(knobs.budget),
        float(knobs.free_ratio),
        out,
        subst,
        ratios,
    )
    return CarResult(out, subst, ratios, int(misses))
