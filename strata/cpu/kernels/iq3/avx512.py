"""AVX-512 VBMI building blocks for IQ3_XXS (pm_avx512.py's position-major kernel uses them).

`LEVELS` are the grid's 8 magnitudes; `LUT_A` / `LUT_B` give grid row g's 3-bit levels l0 | l1 << 4
and l2 | l3 << 4, looked up 64 bytes at a time by `_lut256` (two vpermi2b, sign picks the half).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from strata.cpu.kernels.simd import I8, I16, I32, Emit
from strata.cpu.kernels.tables import IQ3XXS_GRID, IQ3XXS_LEVELS

V64I8 = ir.VectorType(I8, 64)
V32I16 = ir.VectorType(I16, 32)
V16I32 = ir.VectorType(I32, 16)
V64I1 = ir.VectorType(ir.IntType(1), 64)

# ---------------------------------------------------------------- constant tables (uint8)

LEVELS = IQ3XXS_LEVELS.astype(np.uint8)  # [8] the magnitudes 4, 12, ..., 52, 62
_LVL = np.searchsorted(LEVELS, IQ3XXS_GRID).astype(np.uint8)  # [256, 4] level of each position
LUT_A = _LVL[:, 0] | (_LVL[:, 1] << 4)  # [256] l0 | l1 << 4
LUT_B = _LVL[:, 2] | (_LVL[:, 3] << 4)  # [256] l2 | l3 << 4


def _i8(values):
    """uint8 values as the signed ints an IR i8 constant takes."""
    return [int(v) - 256 if v > 127 else int(v) for v in np.asarray(values).ravel()]


# ---------------------------------------------------------------- IR pieces


def _vpermi2b(e: Emit, lo, idx, hi):
    """vpermi2b: byte i = (lo ++ hi)[idx[i] & 127] (two 64-byte tables, 7-bit indices)."""
    return e._call("llvm.x86.avx512.vpermi2var.qi.512", V64I8, [lo, idx, hi])


def _lut256(e: Emit, table, idx, neg):
    """table[idx] for a 256-entry byte table: two vpermi2b, the half picked by bit 7 (neg)."""
    t = [e.const(V64I8, _i8(table[64 * h : 64 * h + 64])) for h in range(4)]
    lo = _vpermi2b(e, t[0], idx, t[1])
    hi = _vpermi2b(e, t[2], idx, t[3])
    return e.b.select(neg, hi, lo)


# ---------------------------------------------------------------- row kernel (the float steps of
# iq3.dot_iq3_xxs, in the same order)
