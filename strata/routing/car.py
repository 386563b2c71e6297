"""Cache-aware routing (CAR): turn some cache misses into hits, as a pure function.

For each token of a decode window, an uncached pick E is replaced by the best *resident* expert C
that the token did not already select, when the router's own score ratio p_C / p_E clears the
threshold. The substituted entry keeps E's router weight (weights are never changed). Candidates
are taken best ratio first, ties by lower expert id (of C, then of E); each C is used once per
token. At most `budget` substitutions per token and layer count against the budget; one whose
ratio is at or above `free_ratio` is free. A threshold of 1.0 or more is OFF: the plan is the
router's own picks, untouched. That is the seeds' rule, `mode="ratio"`.

`mode="slack"` (the default) asks first whether a miss costs anything. The CPU pool computes the
misses while the card runs its share of the layer window; `slack` is how many missed-expert jobs
the pool finishes inside that window (strata.routing.slack measures it). The `floor(slack)`
misses of largest weight are kept (ties: the lower expert id is kept); only the others may be
substituted, by the rule above, and never one whose weight (its share of the token's top-K
router mass, float64) is above `max_weight`. With no slack and `max_weight` >= 1 this is the
seeds' rule exactly.

`car_plan` is the rule of record (NumPy: golden cases, offline replay); `car_plan_fast` is its
compiled twin for the decode path, tested to give the identical plan on random and tied inputs.

T = tokens, E = experts, K = picks per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

TINY = np.finfo(np.float64).tiny
DEFAULT_THRESHOLD = 0.35
MODES = ("slack", "ratio")
DEFAULT_MODE = "slack"
DEFAULT_MAX_WEIGHT = 0.1


@dataclass(frozen=True)
class CarKnobs:
    threshold: float = DEFAULT_THRESHOLD  # >= 1.0 is off
    warmup: int = 0  # decode steps before CAR engages
    budget: int = 0  # most counted substitutions per token and layer (0 = no limit)
    free_ratio: float = 1.0  # ratios at or above this do not count against the budget
    mode: str = DEFAULT_MODE  # "slack": misses the pool hides are kept; "ratio": the seeds' rule
    max_weight: float = DEFAULT_MAX_WEIGHT  # slack mode: a heavier pick is never substituted

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"car mode must be {' or '.join(MODES)}, got {self.mode!r}")
        if not 0.0 < self.max_weight:
            raise ValueError(f"car max weight must be > 0, got {self.max_weight}")
        if not 0.0 < self.threshold:
            raise ValueError(f"car threshold must be > 0 (1.0 = off), got {self.threshold}")
        if self.warmup < 0 or self.budget < 0:
            raise ValueError("car warmup and budget must be >= 0")
        if self.free_ratio <= 0:
            raise ValueError(f"car free ratio must be > 0, got {self.free_ratio}")

    @property
    def enabled(self) -> bool:
        return self.threshold < 1.0

    def bounds(self, slack: float) -> tuple[int, float]:
        """(misses kept for the pool, weight bound) for a window with `slack` jobs of room;
        the ratio mode keeps none and has no bound."""
        if self.mode == "ratio":
            return 0, np.inf
        return keep_count(slack), float(self.max_weight)


def keep_count(slack: float) -> int:
    """The misses a window with `slack` jobs of room keeps (0 for none, NaN or negative)."""
    s = float(slack)
    return int(np.floor(s)) if s >= 1.0 else 0


def eligible(ids, probs, resident, keep: int, max_weight: float) -> np.ndarray:
    """[T, K] bool: the misses the substitution rule may touch. ids [T, K], probs [T, E]."""
    miss = ~resident[ids]  # [T, K]
    pe = probs[np.arange(ids.shape[0])[:, None], ids].astype(np.float64)  # [T, K]
    mass = np.zeros(ids.shape[0])  # [T], summed in pick order as the compiled twins do
    for kk in range(ids.shape[1]):
        mass += pe[:, kk]
    w = pe / np.maximum(mass, TINY)[:, None]  # [T, K]
    # rank among the token's misses: heavier first, ties by the lower expert id
    heavier = (pe[:, None, :] > pe[:, :, None]) | (
        (pe[:, None, :] == pe[:, :, None]) & (ids[:, None, :] < ids[:, :, None])
    )  # [T, K(self), K(other)]
    rank = (heavier & miss[:, None, :]).sum(axis=2)  # [T, K]
    return miss & (rank >= keep) & (w <= max_weight)


@dataclass
class CarResult:
    ids: np.ndarray  # [T, K] int32, substituted picks in place
    substituted: np.ndarray  # [T, K] bool
    ratios: np.ndarray  # [T, K] float32, p_C / p_E where substituted, else 0
    misses: int  # uncached picks before substitution


def car_plan(
    ids: np.ndarray,
    probs: np.ndarray,
    resident: np.ndarray,
    knobs: CarKnobs,
    slack: float = 0.0,
) -> CarResult:
    """Apply CAR to one layer's routing. ids [T, K], probs [T, E] (softmax), resident [E] bool;
    slack: missed-expert jobs the pool finishes inside the card's window (slack mode)."""
    ids = np.asarray(ids, dtype=np.int32)
    t, k = ids.shape
    out = ids.copy()
    subst = np.zeros((t, k), dtype=bool)
    ratios = np.zeros((t, k), dtype=np.float32)
    miss_mask = ~resident[ids]  # [T, K]
    misses = int(miss_mask.sum())
    if not knobs.enabled or misses == 0 or not resident.any():
        return CarResult(out, subst, ratios, misses)
    keep, max_weight = knobs.bounds(slack)
    open_mask = eligible(ids, probs, resident, keep, max_weight)  # [T, K]
    for row in range(t):
        miss_k = np.flatnonzero(open_mask[row])
        if miss_k.size == 0:
            continue
        avail = resident.copy()
        avail[ids[row]] = False  # only experts the token did not already select
        cands = np.flatnonzero(avail)
        if cands.size == 0:
            continue
        p = probs[row]
        # all (miss, candidate) pairs with their ratios, best ratio first, ties by lower ids
        pe = p[ids[row, miss_k]].astype(np.float64)  # [m]
        pc = p[cands].astype(np.float64)  # [c]
        ratio = pc[None, :] / np.maximum(pe[:, None], np.finfo(np.float64).tiny)  # [m, c]
        mi, ci = np.nonzero(ratio >= knobs.threshold)
        if mi.size == 0:
            continue
        r = ratio[mi, ci]
        order = np.lexsort((ids[row, miss_k[mi]], cands[ci], -r))
        used_c, done_k, counted = set(), set(), 0
        # plain Python lists: this loop runs per token and layer on the decode path
        kks, cs, rs = miss_k[mi[order]].tolist(), cands[ci[order]].tolist(), r[order].tolist()
        pairs = zip(kks, cs, rs, strict=True)
        for kk, c, rv in pairs:
            if kk in done_k or c in used_c:
                continue
            free = rv >= knobs.free_ratio
            if knobs.budget and not free and counted >= knobs.budget:
                continue
            out[row, kk] = c
            subst[row, kk] = True
            ratios[row, kk] = rv
            done_k.add(kk)
            used_c.add(c)
            counted += not free
            if len(done_k) == miss_k.size:
                break  # every miss of the token is substituted
    return CarResult(out, subst, ratios, misses)


@njit(cache=True)
def _plan(
    ids, probs, resident, threshold, budget, free_ratio, keep, max_weight, out, subst, ratios
):
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
        mass = 0.0
        for kk in range(k):
            mass += np.float64(probs[row, ids[row, kk]])
        mass = max(mass, TINY)
        m = 0
        for kk in range(k):
            e_k = ids[row, kk]
            if resident[e_k]:
                continue
            pe = np.float64(probs[row, e_k])
            if pe / mass > max_weight:
                continue
            rank = 0  # misses of the token that are heavier (ties: lower expert id)
            for j in range(k):
                e_j = ids[row, j]
                if j != kk and not resident[e_j]:
                    pj = np.float64(probs[row, e_j])
                    if pj > pe or (pj == pe and e_j < e_k):
                        rank += 1
            if rank >= keep:
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
    ids: np.ndarray,
    probs: np.ndarray,
    resident: np.ndarray,
    knobs: CarKnobs,
    slack: float = 0.0,
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
        *knobs.bounds(slack),
        out,
        subst,
        ratios,
    )
    return CarResult(out, subst, ratios, int(misses))
