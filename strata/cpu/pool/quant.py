"""Phases 1 and 3: activation rows quantized, split over threads by quantization units."""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.quantize import act_unit, quantize_units


@njit(cache=True)
def _quant_share(tid, nt, src, n_rows, code, act):
    """Thread tid's contiguous share of quantizing rows 0..n_rows-1 of src, split by units
    (Q8_K super-blocks, else 32 values): one row spreads over threads too. Bit-identical to
    `quantize_row` on every row whatever the split."""
    tid, nt = np.int64(tid), np.int64(nt)  # a parfor index may arrive unsigned: keep ints
    unit = act_unit(code)
    nu = src.shape[1] // unit
    total = n_rows * nu
    lo = tid * total // nt
    hi = (tid + 1) * total // nt
    r = lo // nu if nu > 0 else n_rows
    while r < n_rows and r * nu < hi:
        u0 = max(lo, r * nu) - r * nu
        u1 = min(hi, (r + 1) * nu) - r * nu
        quantize_units(src[r], code, r, act[0], act[1], act[2], act[3], act[4], u0, u1)
        r += 1


@njit(cache=True)
def _quant_x(tid, nt, x, ag, actg, au, actu):
    _quant_share(tid, nt, x, x.shape[0], ag, actg)
    if au != ag:  # up pairs with another activation type: quantize for it too
        _quant_share(tid, nt, x, x.shape[0], au, actu)
