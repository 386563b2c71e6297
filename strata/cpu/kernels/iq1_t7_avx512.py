"""IQ1_M's T7 layout (iq1_t7.py: 7-bit ternary quads, 68 bytes per 256 weights) with AVX-512 VNNI.

For hosts with avx512f/bw/vl/vbmi/vnni (`HAS_AVX512_VBMI`). One super-block, integers times 8 as
in `iq1_t7.dot_t7_portable`:

1. quads: one 64-byte load at the block's 56 quad bytes (the 8 beyond lie in the row: the next
   block's quads or the delta plane), one byte permute (`SPREAD`, vpermb) putting quads
   8 L .. 8 L + 7 (bytes 7 L .. 7 L + 6) into qword L, one vpmultishiftqb (`QUAD_CTRL`: byte
   8 L + t from bit 7 t) leaving quad j in bits 0..6 of byte j (bit 7 is a neighbour's bit,
   which vpermi2b ignores).
2. codes: per digit k one vpermi2b through the 128 bytes `iq1_t7.DIGITS[k]`: byte j is u of
   weight 64 k + j, so vector k meets the natural activation vector x[64 k : 64 k + 64] (a
   vpdpbusd memory operand): no shuffle of the activations.
3. dots: one vpdpbusd per k; its 128-bit lane L sums sub-block 4 k + L (16 weights), every
   lane's factor 1 (|dword| <= 4 * 2 * 128, so vpackssdw packs exactly).
4. scales, delta and offset: T2's (`iq1_t2_avx512.scaled_sum`, its scale words built for
   factor 1 in every lane).

The block sum is the portable kernel's `isum` (the integer sums are exact), and `dot_t7_avx512`
does the float steps of `dot_t7_portable` in the same order: the results are bit-identical to it
and to `iq1.dot_iq1_m` on the GGUF bytes. Against T2's kernel it trades 2 broadcast loads, 2
shifts and 4 ands for 1 load, 1 vpermb, 1 vpmultishiftqb and 4 vpermi2b (the shuffle port), for
12% fewer bytes a block.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit

from strata.cpu.kernels.iq1_avx512 import _dpbusd, _i8, _iq1m_d_pext, _multishift
from strata.cpu.kernels.iq1_t2_avx512 import block_intrinsic, scaled_sum, sw_tables
from strata.cpu.kernels.iq1_t7 import BB, DIGITS
from strata.cpu.kernels.iq3_vbmi import _vpermi2b
from strata.cpu.kernels.simd import I8, I32, Emit

V64I8 = ir.VectorType(I8, 64)
V16I32 = ir.VectorType(I32, 16)

# ---------------------------------------------------------------- constant tables

# byte 8 L + t <- quad byte 7 L + t (t = 7: byte 7 L + 6 again, never read whole)
SPREAD = np.array([7 * (i // 8) + min(i % 8, 6) for i in range(64)], np.uint8)
QUAD_CTRL = np.array([7 * (i % 8) for i in range(64)], np.uint8)  # byte 8 L + t: bits 7 t ..
SW = sw_tables(np.ones(4, np.int64))  # factor 1 in every lane


# ---------------------------------------------------------------- IR


def block_sum(e: Emit, pq, pd, ps, px, p8):
    """The int32 block sum from i8* pq (the block's 56 quad bytes; 8 more are read), pd (its 4
    delta bytes), ps (its 8 scale bytes), px (its 256 int8 x quants) and p8 (its 32 int16 sums
    of 8)."""
    b = e.b
    spread = e.shuffle(e.load(pq, V64I8), [int(i) for i in SPREAD])
    quads = _multishift(e, QUAD_CTRL, spread)
    dots = []
    for k in range(4):
        lo, hi = (e.const(V64I8, _i8(DIGITS[k, 64 * h : 64 * h + 64])) for h in range(2))
        u = b.bitcast(_vpermi2b(e, lo, quads, hi), V16I32)
        x = b.bitcast(e.load(px, V64I8, 64 * k), V16I32)
        dots.append(_dpbusd(e, e.splat(V16I32, 0), u, x))
    return scaled_sum(e, dots, SW, pd, ps, p8)


_blk_t7_avx512 = block_intrinsic(
    block_sum,
    "sum_s (2 ls_s + 1) (8 sum_{i in s} u_i x_i + sum_{g in s} (delta_g - 8) X8_g) over the "
    "T7 block with quads at w[r, qo:qo+56], delta bits at do, scale words at so.",
)


# ---------------------------------------------------------------- row kernel (the float steps of
# iq1_t7.dot_t7_portable, in the same order)


@njit(cache=True)
def dot_t7_avx512(w, r, xq, xd, xb, x8, xf, a):
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        so = 60 * nb + 8 * b
        isum = _blk_t7_avx512(w, r, 56 * b, 56 * nb + 4 * b, so, xq, a, 256 * b, x8, 32 * b)
        d = _iq1m_d_pext(w, r, so - 48)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.125)
    return acc
