"""IQ1_M's T2 layout (t2_avx2.py: 2-bit ternary codes, 76 bytes per 256 weights) with AVX-512 VNNI.

For hosts with avx512f/bw/vl/vbmi/vnni (`HAS_AVX512_VBMI`), in place of `t2_avx2.dot_t2_avx2`.
One super-block, integers times 8 as in `t2_avx2.dot_t2_avx2`:

1. codes: chunk c (32 bytes: bits 2k..2k+1 of byte i = weight 128 c + 32 k + i) is loaded
   into both 256-bit halves of a zmm (a broadcast load). Masked with `CODE_MASK` (0x03 low
   half, 0x0C high half) it holds the codes of weights 128 c .. 128 c + 63 in byte order: u in
   the low half, 4 u in the high; shifted right by 4 first, those of 128 c + 64 .. + 127. So
   code vector m (0..3) meets the natural activation vector x[64 m : 64 m + 64] (a vpdpbusd
   memory operand): no shuffle of the activations at all.
2. dots: one vpdpbusd per m. Its 128-bit lane L sums sub-block s = 4 m + L (16 weights), times
   f = 1 (L < 2) or 4 (L >= 2); a dword is at most 4 * 4 * 3 * 127 < 2^15, so vpackssdw packs
   D0, D1 (and D2, D3) exactly: lane L = four words of sub-block L, then four of 4 + L.
3. scales: vpmaddwd (+ add, one vpdpwssd) by 8 (2 ls + 1) / f of each word's sub-block
   (`SW_CTRL`: a vpmultishiftqb of the 8 scale bytes, broadcast, puts ls in bits 4..6, or 2..4
   where f = 4; a vpternlogd keeps them and sets bit 3, or 1: `SW_MASK`, `SW_OR`).
4. delta and offset: + sum over groups g of 8 of (2 ls + 1)(dl_g - 8) X8_g (X8: the activation's
   sums of 8, x8, natural order, a memory operand of vpmaddwd), the factor a vpermw of the
   32-word table `avx512.M2_TAB` indexed by ls | dl bit << 3: ls from a vpmultishiftqb of
   the scale bytes (`LS_CTRL`), the delta bit from one of the broadcast delta dword
   (`DL_CTRL`), merged by a vpternlogd. Products added, 16 lanes summed.

The block sum is the portable kernel's `isum` (the integer sums are exact); d comes from the
scale words' top nibbles with one pext (`avx512.py`), and `dot_t2_avx512` does the float
steps of `dot_t2_avx2` in the same order, so the results are bit-identical to it.

Per super-block (the loop LLVM 22 compiles for Sapphire / Emerald Rapids: 56 instructions;
dot_t2_avx2's loop has 109, compiled for Zen 3): 2 vbroadcasti64x4 + 2 vpsrld + 4 vpandq, 4
vpdpbusd (activations as memory operands; 4 zeroing vpxor), 2 vpackssdw, 1 vpbroadcastq + 1
vpbroadcastd (loads) + 4 vpmultishiftqb + 3 vpternlog + 1 vpermw, 1 vpmaddwd + 2 vpdpwssd (x8 a
memory operand), the 16-lane sum (8), d and the float steps (10: pext, 2 moves, 2 converts, 3
mul, 1 add, the fence's dead lea), loop control (7). 23 zmm uops besides loads and zeroing
idioms, 9 of them p0-only and 7 p5-only (9 with the sum's two extracts); no activation shuffles.
The tables are module-level arrays shared with the test's NumPy emulation of these instructions
(which runs on any host; the kernel itself needs the features and traps without them).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.features import HAS_AVX512_VBMI
from strata.cpu.kernels.iq1.avx512 import (
    M2_TAB,
    _dpbusd,
    _i8,
    _iq1m_d_pext,
    _multishift,
    _pmaddwd,
)
from strata.cpu.kernels.iq1.t2_avx2 import BB
from strata.cpu.kernels.simd import I8, I16, I32, I64, Emit

V32I8 = ir.VectorType(I8, 32)
V64I8 = ir.VectorType(I8, 64)
V32I16 = ir.VectorType(I16, 32)
V16I32 = ir.VectorType(I32, 16)
V8I64 = ir.VectorType(I64, 8)
F32 = ir.FloatType()

# ---------------------------------------------------------------- constant tables

# byte j of a broadcast chunk: plane 0 (or 2 after the shift) below byte 32, plane 1 (3) above
CODE_MASK = np.array([0x03] * 32 + [0x0C] * 32, np.uint8)
# the factor in a vpdpbusd result's 128-bit lane L (plane 1 / 3 codes stay two bits up)
LANE_F = np.array([1, 1, 4, 4])


def _ls_bit(s):
    """Bit offset of sub-block s's 3-bit scale in the 8 scale bytes read as one u64."""
    return 16 * (s // 4) + 3 * (s % 4)


# vpackssdw(D_2h, D_2h+1) word 8 L + t (128-bit lane L): sub-block 4 (2 h + t // 4) + L
PACKED_SUB = np.array(
    [[4 * (2 * h + t // 4) + L for L in range(4) for t in range(8)] for h in range(2)]
)


def sw_tables(word_f):
    """(SW_CTRL, SW_MASK, SW_OR) for packed dot words whose factor is word_f[w] (32 values, the
    same for both packs): SW_h word w = 8 (2 ls + 1) / f, ls put into bits 4..6 (f = 1:
    16 ls + 8) or 2..4 (f = 4: 4 ls + 2) by a vpmultishiftqb of the broadcast scale bytes, then
    masked and or-ed."""
    f = np.asarray(word_f)
    pos = np.where(f == 1, 4, 2)  # [32] the bit ls goes to
    ctrl = np.array(
        [
            [[(_ls_bit(s) - p) % 64, 0] for s, p in zip(PACKED_SUB[h], pos, strict=True)]
            for h in (0, 1)
        ],
        np.uint8,
    ).reshape(2, 64)
    mask = np.where(f == 1, 0x70, 0x1C).astype(np.uint16)
    return ctrl, mask, np.where(f == 1, 8, 2).astype(np.uint16)


SW_CTRL, SW_MASK, SW_OR = sw_tables(np.repeat(LANE_F, 8))  # a lane's words share its f
# M2 index, word g (group g of 8, natural order): ls of sub-block g // 2 in bits 0..2 (from the
# broadcast scale qword), delta bit g in bit 3 (from the delta dword, broadcast: each qword holds
# it twice, so bit g sits at rotation (g - 3) mod 64)
LS_CTRL = np.array([[_ls_bit(g // 2), 0] for g in range(32)], np.uint8).ravel()
DL_CTRL = np.array([[(g - 3) % 64, 0] for g in range(32)], np.uint8).ravel()


# ---------------------------------------------------------------- IR


def _i16(values):
    return [int(v) - 65536 if v > 32767 else int(v) for v in np.asarray(values).ravel()]


def block_sum(e: Emit, pq, pd, ps, px, p8, reduce: bool = True):
    """The int32 block sum from i8* pq (the block's 64 code bytes), pd (its 4 delta bytes), ps
    (its 8 scale bytes), px (its 256 int8 x quants) and p8 (its 32 int16 sums of 8); reduce
    False: the 16 int32 lanes whose sum it is."""
    b = e.b
    mask = e.const(V64I8, _i8(CODE_MASK))
    dots = []
    for c in range(2):
        chunk = e.shuffle(e.load(pq, V32I8, 32 * c), list(range(32)) * 2)  # broadcast load
        for t in range(2):
            v = chunk
            if t:
                v = b.bitcast(b.lshr(b.bitcast(v, V16I32), e.splat(V16I32, 4)), V64I8)
            u = b.bitcast(b.and_(v, mask), V16I32)
            x = b.bitcast(e.load(px, V64I8, 64 * (2 * c + t)), V16I32)
            dots.append(_dpbusd(e, e.splat(V16I32, 0), u, x))
    return scaled_sum(e, dots, (SW_CTRL, SW_MASK, SW_OR), pd, ps, p8, reduce)


def scaled_sum(e: Emit, dots, sw, pd, ps, p8, reduce: bool = True):
    """The int32 block sum from the four vpdpbusd results `dots` (lane L of dots[m]: sub-block
    4 m + L, times its factor in `sw`, the `sw_tables` of the dots), i8* pd (the block's 4 delta
    bytes), ps (its 8 scale bytes) and p8 (its 32 int16 sums of 8): steps 2-4 of the module doc.
    reduce False: the 16 int32 lanes whose sum it is."""
    b = e.b
    sq = b.bitcast(e.bcast(e.load(ps, I64), V8I64), V64I8)  # the scale bytes, every qword
    acc = None
    for h in range(2):
        pu = e._call("llvm.x86.avx512.packssdw.512", V32I16, dots[2 * h : 2 * h + 2])
        ms = b.bitcast(_multishift(e, sw[0][h], sq), V32I16)
        sw_h = b.or_(b.and_(ms, e.const(V32I16, _i16(sw[1]))), e.const(V32I16, _i16(sw[2])))
        p = _pmaddwd(e, pu, sw_h)
        acc = p if acc is None else b.add(acc, p)
    dq = b.bitcast(e.bcast(e.load(pd, I32), V16I32), V64I8)  # the delta bits, every dword
    ls = b.bitcast(_multishift(e, LS_CTRL, sq), V32I16)
    dl = b.bitcast(_multishift(e, DL_CTRL, dq), V32I16)
    idx = b.xor(b.and_(b.xor(ls, dl), e.splat(V32I16, 7)), dl)  # ls bits 0..2, dl's above
    tab = e.const(V32I16, [int(v) for v in M2_TAB])
    m2 = e._call("llvm.x86.avx512.permvar.hi.512", V32I16, [tab, idx])
    acc = b.add(acc, _pmaddwd(e, e.load(p8, V32I16), m2))
    return e._call("llvm.vector.reduce.add.v16i32", I32, [acc]) if reduce else acc


def block_intrinsic(block_sum_fn, doc: str):
    """A Numba intrinsic (w, r, qo, do, so, xq, a, xo, x8, go) -> int32: `block_sum_fn` over the
    block of row r of w with its codes at qo, delta bits at do and scale words at so, against
    act row a of xq from xo and of x8 from go (a trap where the host lacks the features)."""

    def blk(typingctx, w, r, qo, do, so, xq, a, xo, x8, go):
        n = types.intp
        sig = types.int32(w, n, n, n, n, xq, n, n, x8, n)

        def codegen(context, builder, sg, args):
            e = Emit(context, builder)
            if not HAS_AVX512_VBMI:
                e.trap()
                return ir.Constant(I32, 0)
            wt = sg.args[0]
            pq = e.ptr(wt, args[0], args[1], args[2])
            pd = e.ptr(wt, args[0], args[1], args[3])
            ps = e.ptr(wt, args[0], args[1], args[4])
            px = e.ptr(sg.args[5], args[5], args[6], args[7])
            p8 = e.ptr(sg.args[8], args[8], args[6], args[9])
            return block_sum_fn(e, pq, pd, ps, px, p8)

        return sig, codegen

    blk.__doc__ = doc
    return intrinsic(blk)


_blk_t2_avx512 = block_intrinsic(
    block_sum,
    "sum_s (2 ls_s + 1) (8 sum_{i in s} u_i x_i + sum_{g in s} (delta_g - 8) X8_g) over the "
    "T2 block with codes at w[r, qo:qo+64], delta bits at do, scale words at so.",
)


# ---------------------------------------------------------------- row kernel (the float steps of
# t2_avx2.dot_t2_avx2, in the same order)


@njit(cache=True)
def dot_t2_avx512(w, r, xq, xd, xb, x8, xf, a):
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        so = 68 * nb + 8 * b
        isum = _blk_t2_avx512(w, r, 64 * b, 64 * nb + 4 * b, so, xq, a, 256 * b, x8, 32 * b)
        d = _iq1m_d_pext(w, r, so - 48)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.125)
    return acc
