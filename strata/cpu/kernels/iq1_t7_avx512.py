"""IQ1_M's T7 layout (iq1_t7.py: 7-bit ternary quads, 68 bytes per 256 weights) with AVX-512 VNNI.

For hosts with avx512f/bw/vl/vbmi/vnni (`HAS_AVX512_VBMI`). One super-block, integers times 8 as
in `iq1_t7.dot_t7_portable`:

1. quads: one 64-byte load at the block's 56 quad bytes (the 8 beyond lie in the row: the next
   block's quads or the delta plane), one byte permute (`SPREAD`, vpermb) putting quads
   8 L .. 8 L + 7 (bytes 7 L .. 7 L + 6) into qword L, one vpmultishiftqb (`QUAD_CTRL`: byte
   8 L + t from bit 7 t) leaving quad j in bits 0..6 of byte j (bit 7 is a neighbour's bit,
   which vpermi2b ignores).
2. codes: one vpermi2b through the 128 bytes `iq1_t7.PACKED`: byte j holds the codes of weights
   j, 64 + j, 128 + j, 192 + j in bits 0-1, 2-3, 4-5, 6-7. Masked by 0x03 and 0x0C, and again
   after a dword shift by 4, that is digit vector k = 0..3: u of weights 64 k .. 64 k + 63 in
   natural order, times f = 1, 4, 1, 4 (digits 1 and 3 stay two bits up), against the natural
   activation vector x[64 k : 64 k + 64] (a vpdpbusd memory operand).
3. dots: one vpdpbusd per k; its 128-bit lane L sums sub-block 4 k + L (16 weights);
   |dword| <= 4 * 8 * 128 < 2^15, so vpackssdw packs exactly (words 0-3 of a lane from digit
   2 h, f = 1; 4-7 from 2 h + 1, f = 4: `WORD_F`).
4. scales, delta and offset: T2's (`iq1_t2_avx512.scaled_sum`, its scale words 8 (2 ls + 1) / f
   built for `WORD_F`).

Two row kernels. `dot_t7_avx512` sums each block's 16 lanes and does the float steps of
`dot_t7_portable` in the same order: bit-identical to it and to `iq1.dot_iq1_m` on the GGUF
bytes. `dot_t7_avx512_fv` (`iq1_t2_avx512.row_fv`: one IR loop over the row's blocks) keeps the
lanes: per block f32(lanes) * (f32(xd d) / 8) added to a 16-lane float accumulator, summed once a
row. That saves the per-block horizontal sum (4 shuffle-port uops of ~15: the decode is
shuffle-bound on busy cores) at the price of other roundings (within 2e-6 of the float64
product, as the tests check; deterministic).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit

from strata.cpu.kernels.iq1_avx512 import _dpbusd, _i8, _iq1m_d_pext, _multishift
from strata.cpu.kernels.iq1_t2_avx512 import block_intrinsic, row_intrinsic, scaled_sum, sw_tables
from strata.cpu.kernels.iq1_t7 import BB, PACKED
from strata.cpu.kernels.iq3_vbmi import _vpermi2b
from strata.cpu.kernels.simd import I8, I32, Emit

V64I8 = ir.VectorType(I8, 64)
V16I32 = ir.VectorType(I32, 16)

# ---------------------------------------------------------------- constant tables

# byte 8 L + t <- quad byte 7 L + t (t = 7: byte 7 L + 6 again, never read whole)
SPREAD = np.array([7 * (i // 8) + min(i % 8, 6) for i in range(64)], np.uint8)
QUAD_CTRL = np.array([7 * (i % 8) for i in range(64)], np.uint8)  # byte 8 L + t: bits 7 t ..
WORD_F = np.tile([1, 1, 1, 1, 4, 4, 4, 4], 4)  # the factor of packed word w (either pack)
SW = sw_tables(WORD_F)


# ---------------------------------------------------------------- IR


def block_sum(e: Emit, pq, pd, ps, px, p8, reduce: bool = True):
    """The int32 block sum from i8* pq (the block's 56 quad bytes; 8 more are read), pd (its 4
    delta bytes), ps (its 8 scale bytes), px (its 256 int8 x quants) and p8 (its 32 int16 sums
    of 8); reduce False: the 16 int32 lanes whose sum it is."""
    b = e.b
    spread = e.shuffle(e.load(pq, V64I8), [int(i) for i in SPREAD])
    quads = _multishift(e, QUAD_CTRL, spread)
    lo, hi = (e.const(V64I8, _i8(PACKED[64 * h : 64 * h + 64])) for h in range(2))
    codes = b.bitcast(_vpermi2b(e, lo, quads, hi), V16I32)
    dots = []
    for k in range(4):
        v = b.lshr(codes, e.splat(V16I32, 4)) if k >= 2 else codes
        u = b.and_(v, e.splat(V16I32, 0x03030303 if k % 2 == 0 else 0x0C0C0C0C))
        x = b.bitcast(e.load(px, V64I8, 64 * k), V16I32)
        dots.append(_dpbusd(e, e.splat(V16I32, 0), u, x))
    return scaled_sum(e, dots, SW, pd, ps, p8, reduce)


_blk_t7_avx512 = block_intrinsic(
    block_sum,
    "sum_s (2 ls_s + 1) (8 sum_{i in s} u_i x_i + sum_{g in s} (delta_g - 8) X8_g) over the "
    "T7 block with quads at w[r, qo:qo+56], delta bits at do, scale words at so.",
)


_row_t7_fv = row_intrinsic(block_sum, 56)


# ---------------------------------------------------------------- row kernels


@njit(cache=True)
def dot_t7_avx512(w, r, xq, xd, xb, x8, xf, a):
    """The float steps of iq1_t7.dot_t7_portable, in the same order (bit-identical to it)."""
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        so = 60 * nb + 8 * b
        isum = _blk_t7_avx512(w, r, 56 * b, 56 * nb + 4 * b, so, xq, a, 256 * b, x8, 32 * b)
        d = _iq1m_d_pext(w, r, so - 48)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.125)
    return acc


@njit(cache=True)
def dot_t7_avx512_fv(w, r, xq, xd, xb, x8, xf, a):
    """A float-lane accumulator across the row's blocks (`iq1_t2_avx512.row_fv`)."""
    return _row_t7_fv(w, r, w.shape[1] // BB, xq, xd, x8, a)
