"""Grouping of (token, expert) pairs into tiles for the prefill expert kernels (host side)."""

from __future__ import annotations

import numpy as np
import pytest

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


def test_moe_decode_kernels_by_type():
    from gguf.constants import GGMLQuantizationType as QT

    import strata.gpu.experts as ex

    for q in (QT.Q8_0, QT.IQ3_XXS, QT.IQ2_XXS, QT.IQ2_S):
        assert ex.moe_kernels(q) == ("moe_gate_up", "moe_down_sp2")
    assert ex.moe_kernels(QT.IQ1_M) == ("moe_gate_up_st1", "moe_down")
    for q in (QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.IQ3_S):
        assert ex.moe_kernels(q) == ("moe_gate_up_st1", "moe_down_sp2")


def test_moe_launch_shapes_and_fallback():
    """The gate/up kernels' launch shapes; moe_down_sp2: two rows of two warps a block, past
    SP_IT warp-widths of items a row moe_down's launch instead (wave32 and wave64)."""
    from types import SimpleNamespace

    import strata.gpu.experts as ex

    for warp in (32, 64):
        K = SimpleNamespace(warp=warp, warps_per_block=lambda n, w=warp: max(1, n // w))
        d, t = 2048, 3
        wpb = max(1, 128 // warp)
        plain = ("moe_down", (-(-d // wpb), 3), (wpb * warp,))
        assert ex.down_launch(K, "moe_down_sp2", d, t, 8, 768) == (
            "moe_down_sp2",
            (1024, 3),
            (4 * warp,),
        )
        assert ex.down_launch(K, "moe_down", d, t, 8, 768) == plain
        f_big = (ex.SP_IT * warp // 8 + 1) * 32  # K = 8: one warp-width of items past SP_IT
        assert ex.down_launch(K, "moe_down_sp2", d, t, 8, f_big) == plain
        # gate/up: a row a warp (moe_gate_up), staged rows of ST_WARPS warps a block (st1)
        f, pairs = 768, 24
        assert ex.gate_up_launch(K, "moe_gate_up", f, pairs) == (
            (-(-f // wpb), pairs),
            (wpb * warp,),
        )
        assert ex.gate_up_launch(K, "moe_gate_up_st1", f, pairs) == (
            (-(-f // ex.ST_WARPS), pairs),
            (ex.ST_WARPS * warp,),
        )


def test_compiled_grouping_gives_group_pairs_arrays():
    """pairs_fast.group_pairs_into (a counting sort) writes exactly group_pairs' arrays, and
    distinct_experts is np.unique of the valid ids: random slots with skipped pairs, runs longer
    than a tile, a single slot, nothing valid."""
    from strata.gpu.pairs_fast import distinct_experts, group_pairs_into

    g = np.random.default_rng()
    cases = [g.integers(-1, hi, (t, 8)).astype(np.int32) for t, hi in ((50, 5), (300, 40), (7, 2))]
    cases += [np.full((9, 8), 3, np.int32), np.full((4, 8), -1, np.int32)]
    for slots in cases:
        for nt in (8, 32):
            out = np.full((4, slots.size + 5), -7, np.int32)
            m, n_tiles = group_pairs_into(slots, nt, out)
            order, ts, tf, tn = group_pairs(slots, nt)
            assert (m, n_tiles) == (order.size, ts.size)
            for got, want in zip((out[0, :m], out[1, :n_tiles], out[2, :n_tiles], out[3, :n_tiles]),
                                 (order, ts, tf, tn), strict=True):  # fmt: skip
                np.testing.assert_array_equal(got, want)
        got = distinct_experts(slots, 64)
        np.testing.assert_array_equal(got, np.unique(slots[slots >= 0]))
    with pytest.raises(ValueError, match="int32 \\[4"):
        group_pairs_into(cases[0], 8, np.zeros((4, 3), np.int32))
