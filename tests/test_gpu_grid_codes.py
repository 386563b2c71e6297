"""The i-quant grids as selector codes (strata/gpu/source.py, quant_blocks.cuh STRATA_GRID_CODES),
host side: every code, expanded as the kernels expand it (byte_perm of the level words), gives
gguf.quants' grid row, and the generated tables are the arrays the kernels index."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gguf import quants as gq

from strata.gpu.source import _grid, iq_tables


def _array(name: str) -> np.ndarray:
    m = re.search(rf"const (u16|u32|u64) {name}\[(\d+)\] = \{{(.*?)\}};", iq_tables(), re.S)
    assert m, name
    vals = [int(v.rstrip("ul"), 16) for v in re.findall(r"0x[0-9a-f]+u?l*", m.group(3))]
    assert len(vals) == int(m.group(2))
    return np.array(vals, np.uint64)


def _define(name: str) -> int:
    m = re.search(rf"#define {name} 0x([0-9a-f]+)u", iq_tables())
    assert m, name
    return int(m.group(1), 16)


def _perm_bytes(lo: int, hi: int, sel: int) -> np.ndarray:
    """PTX prmt's default mode for selector nibbles below 8 (quant_blocks.cuh perm_bytes): byte
    k of the result is byte (sel >> 4k) & 7 of hi:lo."""
    v = (hi << 32) | lo
    return np.array([(v >> (8 * ((sel >> (4 * k)) & 7))) & 0xFF for k in range(4)], np.uint8)


def _expand(code: int, width: int, lo: int, hi: int) -> np.ndarray:
    parts = [_perm_bytes(lo, hi, (code >> (16 * h)) & 0xFFFF) for h in range(width // 4)]
    return np.concatenate(parts)


@pytest.mark.parametrize(
    ("code", "cls", "lv"),
    [
        ("iq3xxs_code", gq.IQ3_XXS, ("IQ3XXS_LV0", "IQ3XXS_LV1")),
        ("iq3s_code", gq.IQ3_S, ("IQ3S_LV0", "IQ3S_LV1")),
        ("iq2xxs_code", gq.IQ2_XXS, ("IQ2_LV0", None)),
        ("iq2s_code", gq.IQ2_S, ("IQ2_LV0", None)),
    ],
)
def test_magnitude_codes_expand_to_the_grid(code, cls, lv):
    grid = _grid(cls, np.uint8)  # [N, 4] or [N, 8] magnitudes
    codes = _array(code)
    assert codes.size == grid.shape[0]
    lo, hi = _define(lv[0]), _define(lv[1]) if lv[1] else 0
    got = np.stack([_expand(int(c), grid.shape[1], lo, hi) for c in codes])
    np.testing.assert_array_equal(got, grid)
    # every selector nibble is below 8: prmt's bit 3 (sign replication) never fires
    assert all((int(c) >> (4 * k)) & 8 == 0 for c in codes for k in range(grid.shape[1]))


@pytest.mark.parametrize("delta", [-1, 1])
def test_iq1_codes_expand_to_eight_grid_plus_delta(delta):
    """IQ1_M's decode: the code's nibbles (grid + 1) pick 8 * grid + delta out of one word."""
    grid = _grid(gq.IQ1_S, np.int8).astype(np.int32)  # [2048, 8] of -1, 0, 1
    codes = _array("iq1s_code")
    word = 0x0007FFF7 if delta < 0 else 0x000901F9  # quant_blocks.cuh Fmt<QT_IQ1_M>::decode
    got = np.stack([_expand(int(c), 8, word, 0) for c in codes]).view(np.int8)
    np.testing.assert_array_equal(got.astype(np.int32), 8 * grid + delta)


def test_code_tables_are_aligned_for_word_copies():
    """stage_tab copies a table into shared memory as 32-bit words: the arrays are 8-aligned and
    a whole number of words."""
    for name in ("iq3xxs_code", "iq3s_code", "iq2xxs_code", "iq2s_code", "iq1s_code"):
        decl = rf"alignas\(8\) static __device__ const (u16|u32) {name}\[(\d+)\]"
        m = re.search(decl, iq_tables())
        assert m, name
        assert int(m.group(2)) * (2 if m.group(1) == "u16" else 4) % 16 == 0
