"""The compiled twins of the host's per-layer routing (strata/routing/topk.py, profile.py) give
the results of their rules of record (NumPy, beside them) exactly: top-k (ties included), the
pick histogram, the adaptive cache's scores, mask, counters and swaps."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from strata.routing.profile import AdaptiveCache, observe_fast, observe_step
from strata.routing.topk import count_picks, route_topk, topk_fast


def _logits(g, e: int, kind: str) -> np.ndarray:
    x = (g.standard_normal((1, e)) * g.choice([0.5, 2.0, 8.0])).astype(np.float32)
    if kind == "ties":  # many equal values, at and around the K-th place
        x = np.round(x * 2) / 2
    elif kind == "flat":
        x[:] = 0.25
    elif kind == "underflow":  # probabilities that round to zero, tied at 0
        x[0, : e // 2] = -200.0
    return x


@pytest.mark.parametrize("kind", ["plain", "ties", "flat", "underflow"])
@pytest.mark.parametrize("renorm", [True, False])
@pytest.mark.parametrize("t", [1, 2, 37])
def test_topk_fast_is_route_topk(kind, renorm, t):
    """Decode (T = 1) and prompt rows (T > 1, each row drawn as `kind`): the same arrays."""
    g = np.random.default_rng()
    for e, k in ((128, 8), (64, 4), (8, 8), (60, 1)):
        for _ in range(20 if t == 1 else 4):
            x = np.concatenate([_logits(g, e, kind) for _ in range(t)])  # [T, E]
            a, b = topk_fast(x, k, renorm), route_topk(x, k, renorm)
            for u, v in zip(a, b, strict=True):
                assert u.dtype == v.dtype and u.shape == v.shape
                assert np.array_equal(u.view(np.uint8), v.view(np.uint8))


def test_count_picks_is_add_at():
    g = np.random.default_rng()
    ids = g.integers(0, 32, (5, 8)).astype(np.int32)
    a, b = np.zeros(32, np.int64), np.zeros(32, np.int64)
    count_picks(a, ids)
    np.add.at(b, ids.ravel(), 1)
    assert np.array_equal(a, b) and a.sum() == 40


@pytest.mark.parametrize("max_swaps", [0, 3, 1000])
def test_observe_fast_is_observe(max_swaps):
    g = np.random.default_rng()
    n_layer, e, k = 3, 32, 4
    resident = g.random((n_layer, e)) < 0.5
    ref = AdaptiveCache(resident.copy(), max_swaps=max_swaps, margin=0.5)
    fast = copy.deepcopy(ref)
    for step in range(60):
        if step % 20 == 0:
            ref.new_window()
            fast.new_window()
        layer = int(g.integers(n_layer))
        pop = g.dirichlet(np.full(e, 0.3))  # skewed picks: swaps happen
        ids = np.stack([g.choice(e, k, replace=False, p=pop) for _ in range(g.integers(1, 3))])
        want = ref.observe(layer, ids.astype(np.int64))
        got = observe_fast(fast, layer, ids.astype(np.int32))
        assert got == want
        assert np.array_equal(fast.score, ref.score)
        assert np.array_equal(fast.resident, ref.resident)
        assert (fast.swaps_in_window, fast.swaps_total) == (ref.swaps_in_window, ref.swaps_total)
    if max_swaps:
        assert ref.swaps_total > 0


@pytest.mark.parametrize("max_swaps", [0, 5, 1000])
def test_observe_step_is_observe_layer_by_layer(max_swaps):
    """One compiled call over a decode step's picks [L, K] == observe on each layer in order
    (the swap room of a window shared as the calls share it): swaps, scores, mask, counters."""
    g = np.random.default_rng()
    n_layer, e, k = 6, 32, 4
    ref = AdaptiveCache(g.random((n_layer, e)) < 0.5, max_swaps=max_swaps, margin=0.5)
    fast = copy.deepcopy(ref)
    pops = [g.dirichlet(np.full(e, 0.3)) for _ in range(n_layer)]  # skewed: swaps happen
    full = False  # a window's room ran out
    for step in range(40):
        if step % 15 == 0:
            ref.new_window()
            fast.new_window()
        ids = np.stack([g.choice(e, k, replace=False, p=p) for p in pops])  # [L, K]
        want = [(i, c, a) for i in range(n_layer) for c, a in ref.observe(i, ids[i : i + 1])]
        assert observe_step(fast, ids) == want
        assert np.array_equal(fast.score, ref.score)
        assert np.array_equal(fast.resident, ref.resident)
        assert (fast.swaps_in_window, fast.swaps_total) == (ref.swaps_in_window, ref.swaps_total)
        full |= 0 < max_swaps == ref.swaps_in_window
    if max_swaps:
        assert ref.swaps_total > 0
    assert full == (max_swaps == 5)
