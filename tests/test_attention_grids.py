"""attention.dec_grid_for, host side: short positions take the one-launch kernel; otherwise the
grid it picks for a position splits
that position's keys exactly as the full grid does (dec_split of attention.cu, written out
below), and no smaller grid of the workspace would; the card's bits are held equal in
tests/test_gpu_decode.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from strata.gpu.attention import DEC_SHORT_GRID, dec_grid_for


def _dec_split(s: int, nsplit: int, min_chunk: int) -> tuple[int, int]:
    """attention.cu dec_split -> (chunk, nlive)."""
    want = min(nsplit, -(-s // min_chunk))
    chunk = (-(-s // want) + 31) & ~31
    return chunk, -(-s // chunk)


@pytest.mark.parametrize("grids,mc", [((8, 32, 132), 64), ((4, 66), 32), ((132,), 64)])
def test_the_picked_grid_splits_as_the_full_one(grids, mc):
    ws = SimpleNamespace(dec_grids=grids, dec_min_chunk=mc, dec_short=0)
    full = grids[-1]
    for pos in range(0, 12000, 7):
        n = dec_grid_for(ws, pos)
        assert n in grids
        assert _dec_split(pos + 1, n, mc) == _dec_split(pos + 1, full, mc), (pos, n)
        smaller = [m for m in grids if m < n]
        assert all(_dec_split(pos + 1, m, mc) != _dec_split(pos + 1, full, mc) for m in smaller)


@pytest.mark.parametrize("short", [1, 1024, 2048])
def test_short_positions_take_the_one_launch_kernel(short):
    ws = SimpleNamespace(dec_grids=(8, 32, 132), dec_min_chunk=64, dec_short=short)
    for pos in range(0, 5000, 3):
        n = dec_grid_for(ws, pos)
        assert (n == DEC_SHORT_GRID) == (pos + 1 <= short), (pos, n)
        if n != DEC_SHORT_GRID:
            assert n == dec_grid_for(SimpleNamespace(**{**vars(ws), "dec_short": 0}), pos)
