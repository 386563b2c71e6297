"""IQ2_S on the GGUF bytes (82 bytes per 256 weights, no repack) with AVX-512 VBMI + VNNI.

For hosts with avx512f/bw/vl/vbmi/vnni (`HAS_AVX512_VBMI`), where the AVX2 kernel
(iq2_avx2.py) loads the 32 grid rows of a super-block one u64 at a time and inserts them into
vectors. The block: f16 d (bytes 0, 1), qs[32] (2..33: the low 8 bits of each group's 10-bit
grid index), signs[32] (34..65: bit e of byte k = sign of weight 8 k + e, as they are), qh[8]
(66..73: 2 high index bits per group, group k at bits 2 (k % 4) of byte k // 4), scales[8]
(74..81: one nibble ls per 16 weights, low nibble first). The 1024-row grid (magnitudes in
{8, 25, 43}) is one 16-lane vpgatherdd per 128 weights from `GRID_NIB` (4 KiB, L1-resident):
row g as one dword whose byte j is c_j | c_{j+4} << 4 (c: the magnitude's level 0, 1, 2). One
super-block:

1. indices: the bytes 2..33 and 42..73 (two 32-byte loads) go through one byte permute (`PSEL`,
   vpermt2b) so that qword j of P holds, for the group pair (a, a + 1) = (`GROUPS[2 j]`, + 1) of
   the first gather, qs_a, qs_a+1, their qh byte, and the same three for the pair 16 + a of the
   second gather. One vpmultishiftqb per gather (`IDX_CTRL`) moves qs into byte 0 and the
   group's two qh bits into the low bits of byte 1 of its dword; a vpandd 0x3FF leaves the
   10-bit index.
2. grid rows: vpgatherdd from `GRID_NIB`, lane i = group `GROUPS[i]` (+ 16 for the second).
   The levels are at most 2, so bit 7 of every byte of G and of G >> 4 (vpsrld) is clear, and
   one vpshufb each with `MAG` (8, 25, 43 per 128-bit lane) gives the u8 magnitudes of weights
   0..3 (from G's low nibbles) and 4..7 (G >> 4) of the lane's group.
3. signs: the 32 sign bytes are, read as four u64, a bit mask over the natural activation
   bytes; each natural 64-byte activation vector (4 per block) becomes 0 - x where its mask
   bit is set (a kmovq from memory and a merge-masked vpsubb; x = -128 would wrap as in the
   AVX2 kernel's xor / sub: Q8_K quants are in -127..127 anyway).
4. activations: the lane order `GROUPS` (per 128-bit lane k: groups 2 k, 2 k + 1, 8 + 2 k,
   9 + 2 k) makes the matching signed quants an in-lane two-source dword shuffle of the natural
   vectors (`X_LO`, `X_HI`: vshufps), XL / XH per gather, four in all.
5. dots: vpmaddubsw of the magnitudes (u8 <= 43) and XL / XH gives int16 pair sums
   (|.| <= 2 * 43 * 128: no saturation); the L and H ones are added (vpaddw: |.| <= 4 * 43 *
   128 < 2^15, exact) and vpmaddwd multiplies them by 2 ls + 1 of the group's 16-weight
   sub-block (`SC_CTRL`: a vpmultishiftqb of the 8 scale bytes, broadcast, puts ls in bits
   1..4 of both words of the lane's dword; a vpternlogq makes 2 ls + 1), summing the pairs into
   dwords; both gathers' dwords are added and the 16 lanes summed.

The block sum is the AVX2 (and portable) kernel's `isum` (the integer sums are exact), and
`dot_iq2_s_avx512` does the float steps of `iq2_avx2.dot_iq2_s_avx2` in the same order, so
the results are bit-identical to it.

Per super-block (the loop LLVM 22 compiles for Sapphire / Emerald Rapids: 70 instructions):
2 vbroadcasti64x4 loads + 1 vpermt2b, 2 vpmultishiftqb + 2 vpandd, 2 vpgatherdd (32 element
loads; 2 kxnorw + 2 vpxord for their masks and pass-through), 2 vpsrld + 4 vpshufb, 4 x loads
+ 4 kmovq (loads) + 4 masked vpsubb, 4 vshufps, 4 vpmaddubsw + 2 vpaddw, 1 vpbroadcastq (a
load) + 2 vpmultishiftqb + 2 vpternlogq, 2 vpmaddwd + 1 vpaddd, the 16-lane sum (2 extracts,
2 vpshufd, 4 vpaddd), d and the float steps (vmovsh, 2 converts, 3 mul, 1 add), 6 loop
instructions: 32 zmm ALU uops besides the gathers, 13 of them on the shuffle port (17 with the
sum's), where the AVX2 kernel does 32 scalar row loads + inserts and 32 index computations. The
gathers bound it (about the IQ1_M kernel's speed, also two 16-lane gathers a block). The tables
are module-level arrays, shared with the test (tests/test_cpu_iq2s_avx512.py), which also
checks the compiled asm.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.iq1_avx512 import _fence, _gather, _i8, _multishift, _pmaddwd, _shuffle2
from strata.cpu.kernels.iq2 import S_BB
from strata.cpu.kernels.simd import HAS_AVX512_VBMI, I8, I16, I32, I64, Emit, const_table
from strata.cpu.kernels.tables import IQ2S_GRID

V32I8 = ir.VectorType(I8, 32)
V64I8 = ir.VectorType(I8, 64)
V32I16 = ir.VectorType(I16, 32)
V16I32 = ir.VectorType(I32, 16)
V8I64 = ir.VectorType(I64, 8)
V64I1 = ir.VectorType(ir.IntType(1), 64)

# ---------------------------------------------------------------- constant tables

MAG_LEVELS = np.array([8, 25, 43], np.uint8)  # the grid's magnitudes, level c -> MAG_LEVELS[c]
_C = np.searchsorted(MAG_LEVELS, IQ2S_GRID).astype(np.uint32)  # [1024, 8] levels
# [1024] grid row g: byte j = c_j | c_{j+4} << 4 (low nibbles: weights 0..3, high: 4..7)
GRID_NIB = ((_C[:, :4] | (_C[:, 4:] << 4)) << (8 * np.arange(4, dtype=np.uint32))).sum(
    -1, dtype=np.uint32
)
# vpshufb table (each 128-bit lane): level -> magnitude
MAG = np.tile(np.concatenate([MAG_LEVELS, np.zeros(13, np.uint8)]), 4)
# gather lane i -> group (of the first 16; the second gather: + 16): per 128-bit lane k, groups
# 2 k, 2 k + 1, 8 + 2 k, 9 + 2 k, so that XL / XH are vshufps of the natural activation vectors
GROUPS = np.array([g for k in range(4) for g in (2 * k, 2 * k + 1, 8 + 2 * k, 9 + 2 * k)])
_PAIR = GROUPS[0::2]  # [8] the even group a_j of qword j's pair (a_j, a_j + 1)
# the loads: A = block bytes 2..33 (lanes 0..31), B = bytes 42..73 (lanes 32..63): qs_k is
# lane k, qh_m (block byte 66 + m) lane 56 + m
_QS, _QH = 0, 56
# P byte 8 j + t = lane PSEL[8 j + t] of A|B: qs_a, qs_a+1, qh(a), qs_16+a, qs_17+a, qh(16 + a),
# and two unused bytes
PSEL = np.array(
    [
        v
        for a in _PAIR
        for v in (_QS + a, _QS + a + 1, _QH + a // 4, _QS + 16 + a, _QS + 17 + a, _QH + 4 + a // 4)
        + (0, 0)
    ],
    np.uint8,
)
# vpmultishiftqb bit offsets (within P's qword) of each index dword's bytes 0, 1 (2, 3: any,
# cleared by the 0x3FF mask): even lane qs at byte 0 / qh bits of group a, odd lane byte 1 /
# group a + 1 (the pair shares its qh byte: a is even, a % 4 in {0, 2})
IDX_CTRL = np.array(
    [
        [
            v
            for a in _PAIR
            for v in (
                24 * h,
                16 + 24 * h + 2 * (a % 4),
                0,
                0,
                8 + 24 * h,
                16 + 24 * h + 2 * ((a + 1) % 4),
                0,
                0,
            )
        ]
        for h in range(2)
    ],
    np.uint8,
)
# the x dwords (of the 32 in two natural 64-byte vectors) each gather lane meets: L / H halves
X_LO = [2 * int(g) for g in GROUPS]
X_HI = [2 * int(g) + 1 for g in GROUPS]
# the scale multiplier per gather: both words of lane i's dword take ls of sub-block
# (GROUPS[i] + 16 h) // 2 (bit offset 4 s in the scale qword) into bits 1..4 (offset - 1,
# rotating); the odd bytes are cleared by the mask
SC_CTRL = np.array(
    [
        [
            (4 * ((int(g) + 16 * h) // 2) - 1) % 64 if t % 2 == 0 else 0
            for g in GROUPS
            for t in range(4)
        ]
        for h in range(2)
    ],
    np.uint8,
)


# ---------------------------------------------------------------- IR pieces (the rest shared with
# iq1_avx512.py)


def _pshufb(e: Emit, table, idx):
    """vpshufb: per 128-bit lane, byte i = table[idx[i] & 15] (0 where idx[i] < 0)."""
    return e._call("llvm.x86.avx512.pshuf.b.512", V64I8, [table, idx])


def _maddubs(e: Emit, u8, s8):
    return e._call("llvm.x86.avx512.pmaddubs.w.512", V32I16, [u8, s8])


def block_sum(e: Emit, pw, px):
    """The int32 block sum from i8* pw (the 82 block bytes) and px (its 256 int8 x quants)."""
    b = e.b
    lo, hi = e.load(pw, V32I8, 2), e.load(pw, V32I8, 42)  # bytes 2..33 and 42..73
    p = _shuffle2(e, lo, hi, [int(i) for i in PSEL])
    grid = const_table(e, "strata_iq2s_grid_nib_u32", I32, [int(v) for v in GRID_NIB])
    mag = e.const(V64I8, _i8(MAG))
    _fence(e, pw)  # else LLVM pulls the sign qwords out of the index vector
    sq = b.bitcast(e.bcast(e.load(pw, I64, 74), V8I64), V64I8)  # the scale bytes, every qword
    zero = e.splat(V64I8, 0)
    acc = e.splat(V16I32, 0)
    for h in range(2):  # groups 0..15, then 16..31
        idx = b.and_(b.bitcast(_multishift(e, IDX_CTRL[h], p), V16I32), e.splat(V16I32, 0x3FF))
        g = _gather(e, grid, idx)
        m_l = _pshufb(e, mag, b.bitcast(g, V64I8))
        m_h = _pshufb(e, mag, b.bitcast(b.lshr(g, e.splat(V16I32, 4)), V64I8))
        xs = []
        for v in range(2):  # the natural vectors: groups 16 h + 8 v .. + 7, signs applied
            x = e.load(px, V64I8, 128 * h + 64 * v)
            neg = b.bitcast(e.load(pw, I64, 34 + 16 * h + 8 * v), V64I1)
            xs.append(b.bitcast(b.select(neg, b.sub(zero, x), x), V16I32))
        xl = b.bitcast(_shuffle2(e, xs[0], xs[1], X_LO), V64I8)
        xh = b.bitcast(_shuffle2(e, xs[0], xs[1], X_HI), V64I8)
        sc = b.bitcast(_multishift(e, SC_CTRL[h], sq), V32I16)
        sc = b.or_(b.and_(sc, e.splat(V32I16, 0x1E)), e.splat(V32I16, 1))
        pairs = b.add(_maddubs(e, m_l, xl), _maddubs(e, m_h, xh))  # |.| <= 4 * 43 * 128
        acc = b.add(acc, _pmaddwd(e, pairs, sc))
    return e._call("llvm.vector.reduce.add.v16i32", I32, [acc])


@intrinsic
def _blk_iq2_s_avx512(typingctx, w, r, o, xq, a, xo):
    """sum_h (2 ls_h + 1) sum_{i in h} g_i s_i x_i over the IQ2_S block at w[r, o:o+82]."""
    sig = types.int32(w, types.intp, types.intp, xq, types.intp, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        if not HAS_AVX512_VBMI:
            e.trap()
            return ir.Constant(I32, 0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        px = e.ptr(sg.args[3], args[3], args[4], args[5])
        return block_sum(e, pw, px)

    return sig, codegen


# ---------------------------------------------------------------- row kernel (the float steps of
# iq2_avx2.dot_iq2_s_avx2, in the same order)


@njit(cache=True)
def dot_iq2_s_avx512(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // S_BB):
        o = b * S_BB
        isum = _blk_iq2_s_avx512(w, r, o, xq, a, 256 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.125)
    return acc
