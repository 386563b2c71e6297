"""Cache-aware routing (CAR): turn some cache misses into hits, as a pure function.

For each token of a decode window, an uncached pick E is replaced by the best *resident* expert C
that the token did not already select, when the router's own score ratio p_C / p_E clears the
threshold. The substituted entry keeps E's router weight (weights are never changed). Candidates
are taken best ratio first, ties by lower expert id (of C, then of E); each C is used once per
token. At most `budget` substitutions per token and layer count against the budget; one whose
ratio is at or above `free_ratio` is free. A threshold of 1.0 or more is OFF: the plan is the
router's own picks, untouched.

T = tokens, E = experts, K = picks per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_THRESHOLD = 0.35


@dataclass(frozen=True)
class CarKnobs:
    threshold: float = DEFAULT_THRESHOLD  # >= 1.0 is off
    warmup: int = 0  # decode steps before CAR engages
    budget: int = 0  # most counted substitutions per token and layer (0 = no limit)
    free_ratio: float = 1.0  # ratios at or above this do not count against the budget

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold:
            raise ValueError(f"car threshold must be > 0 (1.0 = off), got {self.threshold}")
        if self.warmup < 0 or self.budget < 0:
            raise ValueError("car warmup and budget must be >= 0")
        if self.free_ratio <= 0:
            raise ValueError(f"car free ratio must be > 0, got {self.free_ratio}")

    @property
    def enabled(self) -> bool:
        return self.threshold < 1.0


@dataclass
class CarResult:
    ids: np.ndarray  # [T, K] int32, substituted picks in place
    substituted: np.ndarray  # [T, K] bool
    ratios: np.ndarray  # [T, K] float32, p_C / p_E where substituted, else 0
    misses: int  # uncached picks before substitution


def car_plan(
    ids: np.ndarray, probs: np.ndarray, resident: np.ndarray, knobs: CarKnobs
) -> CarResult:
    """Apply CAR to one layer's routing. ids [T, K], probs [T, E] (softmax), resident [E] bool."""
    ids = np.asarray(ids, dtype=np.int32)
    t, k = ids.shape
    out = ids.copy()
    subst = np.zeros((t, k), dtype=bool)
    ratios = np.zeros((t, k), dtype=np.float32)
    miss_mask = ~resident[ids]  # [T, K]
    misses = int(miss_mask.sum())
    if not knobs.enabled or misses == 0 or not resident.any():
        return CarResult(out, subst, ratios, misses)
    for row in range(t):
        miss_k = np.flatnonzero(miss_mask[row])
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
