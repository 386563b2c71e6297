"""Grouping of (token, expert) pairs into tiles for the prefill expert kernels (host side)."""

from __future__ import annotations

import numpy as np

from strata.gpu.experts import group_pairs


def test_group_pairs_tiles_cover_each_valid_pair_once():
    g = np.random.default_rng()
    slots = g.integers(-1, 5, (50, 8)).astype(np.int32)
    order, ts, tf, tn = group_pairs(slots)
    flat = slots.ravel()
    assert sorted(order.tolist()) == np.flatnonzero(flat >= 0).tolist()
    covered = np.concatenate([np.arange(a, a + n) for a, n in zip(tf, tn, strict=True)])
    assert covered.tolist() == list(range(order.size)) and tn.max() <= 8
    for s, a, n in zip(ts, tf, tn, strict=True):
        assert np.all(flat[order[a : a + n]] == s)
