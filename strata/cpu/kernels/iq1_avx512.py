"""IQ1_M on the GGUF bytes (56 bytes per 256 weights, no repack) with AVX-512 VBMI + VNNI.

For hosts with avx512f/bw/vl/vbmi/vnni (`HAS_AVX512_VBMI`), where the AVX2 gather kernel
(gather.py) needs 8 small gathers a super-block and the T2 repack reads 1.36x the bytes. The
2048-row ternary grid is too big for vpermi2b tables, so it stays a gather, but one 16-lane
vpgatherdd fetches 128 weights: `GRID_NIB` (8 KiB, L1-resident) holds row g as one dword whose
byte j is u_j | u_{j+4} << 4 (u = grid value + 1, in {0, 1, 2}). One super-block, integers
times 8 as in `iq1.dot_iq1_m`:

1. indices: the bytes 0..55 (two 32-byte loads) go through one byte permute (`PSEL`, vpermt2b)
   so that qword j of P holds, for the group pair (a, a + 1) = (`GROUPS[2 j]`, + 1) of the first
   gather, qs_a, qs_a+1, their qh byte, the same three for the pair 16 + a of the second
   gather, and the qh bytes of groups 4 j .. 4 j + 3 (step 4). One vpmultishiftqb per gather
   (`IDX_CTRL`) moves qs into byte 0 and the group's qh nibble into byte 1 of its dword; a
   vpandd 0x7FF leaves the 11-bit index.
2. grid rows: vpgatherdd from `GRID_NIB`, lane i = group `GROUPS[i]` (+ 16 for the second).
   L = G & 0x0F0F0F0F gives per lane the u8 codes of weights 0..3 of the group, H = (G >> 4) &
   0x0F0F0F0F those of weights 4..7.
3. activations: the lane order `GROUPS` (per 128-bit lane k: groups 2 k, 2 k + 1, 8 + 2 k,
   9 + 2 k) makes the matching int8 quants an in-lane two-source dword shuffle of the natural
   64-byte vectors (`X_LO`, `X_HI`: vshufps), XL / XH per gather, four in all.
4. dots: two vpdpbusd per gather into one accumulator (L x XL, then H x XH): lane i =
   U_k = sum over group k of u x, |U_k| <= 8 * 2 * 127 < 2^15, so vpackssdw packs both
   gathers' sums into 32 int16 exactly; vpmaddwd multiplies them by 8 (2 ls + 1) of each group's
   16-weight sub-block (`M1_CTRL`: a vpmultishiftqb of the 8 scale bytes, broadcast, puts ls in
   bits 4..6 of the word; a vpternlogd keeps them and sets bit 3).
5. delta and offset: 8 sum g x + dl X8 = 8 U + (dl - 8) X8 (X8: the activation's sums of 8, x8).
   The 32 X8 words (natural order, one load) are multiplied (vpmaddwd) by (2 ls + 1)(dl - 8),
   a vpermw of the 32-word table `M2_TAB` indexed by ls | dl_bit << 3: ls from a vpmultishiftqb
   of the scale bytes (`LS_CTRL`), the delta bit from one of P's step 4 bytes (`DL_CTRL`),
   merged by a vpternlogd. Both products are added and the 16 lanes summed.

The block sum is the portable kernel's `isum` (the integer sums are exact); the f16 d comes
from the scale words' top nibbles with one pext (bmi2), and `dot_iq1_m_avx512` does the float
steps of `iq1.dot_iq1_m` in the same order, so the results are bit-identical to it.

Per super-block (the loop LLVM 22 compiles for Sapphire / Emerald Rapids: 65 instructions):
2 loads + 1 vpermt2b, 2 vpmultishiftqb + 2 vpandd, 2 vpgatherdd (32 element loads), 4 vpandq +
2 vpsrld, 4 x loads + 4 vshufps, 4 vpdpbusd, 1 vpackssdw, 1 vpbroadcastq (a load) + 3
vpmultishiftqb + 2 vpternlog + 1 vpermw, 1 vpmaddwd + 1 vpdpwssd (LLVM fuses the second
vpmaddwd and the add), the 16-lane sum (8), and d / the float steps (pext, 2 converts, 3 mul,
1 add): 29 zmm uops besides the gathers, 12 of them on the shuffle port (14 with the sum's two
extracts). The tables above are module-level arrays, shared with the test's NumPy emulation
of these instructions (which runs on any host; the kernel itself needs the features and traps
without them).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_to_f32_ir
from strata.cpu.kernels.simd import FEATURES, HAS_AVX512_VBMI, I8, I16, I32, I64, Emit, const_table
from strata.cpu.kernels.tables import IQ1S_GRID

BB = 56
V32I8 = ir.VectorType(I8, 32)
V64I8 = ir.VectorType(I8, 64)
V32I16 = ir.VectorType(I16, 32)
V16I32 = ir.VectorType(I32, 16)
V8I64 = ir.VectorType(I64, 8)
V16I1 = ir.VectorType(ir.IntType(1), 16)

# ---------------------------------------------------------------- constant tables

_U = (IQ1S_GRID.astype(np.int64) + 1).astype(np.uint32)  # [2048, 8] u = g + 1
# [2048] grid row g: byte j = u_j | u_{j+4} << 4 (low nibbles: weights 0..3, high: 4..7)
GRID_NIB = ((_U[:, :4] | (_U[:, 4:] << 4)) << (8 * np.arange(4, dtype=np.uint32))).sum(
    -1, dtype=np.uint32
)
# gather lane i -> group (of the first 16; the second gather: + 16): per 128-bit lane k, groups
# 2 k, 2 k + 1, 8 + 2 k, 9 + 2 k, so that XL / XH are vshufps of the natural activation vectors
GROUPS = np.array([g for k in range(4) for g in (2 * k, 2 * k + 1, 8 + 2 * k, 9 + 2 * k)])
_PAIR = GROUPS[0::2]  # [8] the even group a_j of qword j's pair (a_j, a_j + 1)
# P byte 8 j + t = block byte PSEL[8 j + t]: qs_a, qs_a+1, qh(a), qs_16+a, qs_17+a, qh(16 + a),
# then the qh bytes of groups 4 j .. 4 j + 3 (for the delta bits in natural group order)
PSEL = np.array(
    [
        v
        for j, a in enumerate(_PAIR)
        for v in (a, a + 1, 32 + a // 2, 16 + a, 17 + a, 40 + a // 2, 32 + 2 * j, 33 + 2 * j)
    ],
    np.uint8,
)
# vpmultishiftqb bit offsets (within P's qword) of each index dword's bytes 0, 1 (2, 3: any,
# cleared by the 0x7FF mask): even lane qs at byte 0 / low qh nibble, odd lane byte 1 / high
IDX_CTRL = np.array([[0, 16, 0, 0, 8, 20, 0, 0] * 8, [24, 40, 0, 0, 32, 44, 0, 0] * 8], np.uint8)
# the x dwords (of the 32 in two natural 64-byte vectors) each gather lane meets: L / H halves
X_LO = [2 * int(g) for g in GROUPS]
X_HI = [2 * int(g) + 1 for g in GROUPS]


def _ls_bit(s):
    """Bit offset of sub-block s's 3-bit scale in the 8 scale bytes read as one u64."""
    return 16 * (s // 4) + 3 * (s % 4)


# vpackssdw(acc_1, acc_2) word 8 k + m (128-bit lane k): the group it sums
PACKED_GROUPS = np.array(
    [int(GROUPS[4 * k + m % 4]) + 16 * (m // 4) for k in range(4) for m in range(8)]
)
# M1: word w's low byte takes ls of PACKED_GROUPS[w] into bits 4..6 (offset - 4, rotating)
M1_CTRL = np.array([[(_ls_bit(g // 2) - 4) % 64, 0] for g in PACKED_GROUPS], np.uint8).ravel()
# M2 index: word k (group k, natural order) gets ls in bits 0..2 (LS_CTRL, from the scale bytes)
# and its qh nibble in bits 0..3 (DL_CTRL, from P's bytes 6, 7): bit 3 is the delta sign
LS_CTRL = np.array([[_ls_bit(k // 2), 0] for k in range(32)], np.uint8).ravel()
DL_CTRL = np.array([[8 * (6 + (k % 4) // 2) + 4 * (k % 2), 0] for k in range(32)], np.uint8).ravel()
# vpermw table (5 index bits; bit 4 is a neighbour's bit: two copies): (2 ls + 1)(dl - 8)
M2_TAB = np.array([(2 * (i & 7) + 1) * (-9 if i & 8 else -7) for i in range(32)], np.int16)


def _i8(values):
    """uint8 values as the signed ints an IR i8 constant takes."""
    return [int(v) - 256 if v > 127 else int(v) for v in np.asarray(values).ravel()]


# ---------------------------------------------------------------- IR pieces


def _shuffle2(e: Emit, a, b, lanes):
    return e.b.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, len(lanes)), list(lanes)))


def _multishift(e: Emit, ctrl, data):
    """vpmultishiftqb: byte i = the 8 bits of data's qword i // 8 from bit ctrl[i] (rotating)."""
    return e._call("llvm.x86.avx512.pmultishift.qb.512", V64I8, [e.const(V64I8, _i8(ctrl)), data])


def _gather(e: Emit, table, idx):
    """vpgatherdd: the 16 dwords table[idx]."""
    ones = ir.Constant(V16I1, [1] * 16)
    args = [e.splat(V16I32, 0), table, idx, ones, ir.Constant(I32, 4)]
    return e._call("llvm.x86.avx512.mask.gather.dpi.512", V16I32, args)


def _dpbusd(e: Emit, acc, u8, s8):
    return e._call("llvm.x86.avx512.vpdpbusd.512", V16I32, [acc, u8, s8])


def _pmaddwd(e: Emit, a, b):
    return e._call("llvm.x86.avx512.pmaddw.d.512", V16I32, [a, b])


def _words(e: Emit, v, value):
    """v & value in each 16-bit lane (v: any 512-bit vector), as <32 x i16>."""
    return e.b.and_(e.b.bitcast(v, V32I16), e.splat(V32I16, value))


def _fence(e: Emit, p):
    """An empty asm that may write memory at p: loads after it are not taken from vectors
    loaded before (LLVM would rebuild the scale qword from the first loads with vpermq /
    vextract + vpextrq, three shuffle-port uops, where a broadcast and a scalar load are free)."""
    e.b.asm(ir.FunctionType(ir.VoidType(), [p.type]), "", "r,~{memory}", [p], True)


def block_sum(e: Emit, pw, px, p8):
    """The int32 block sum from i8* pw (the 56 block bytes), px (its 256 int8 x quants) and p8
    (its 32 int16 sums of 8)."""
    b = e.b
    lo, hi = e.load(pw, V32I8), e.load(pw, V32I8, 24)  # bytes 0..31 and 24..55
    p = _shuffle2(e, lo, hi, [int(i) if i < 32 else int(i) + 8 for i in PSEL])
    grid = const_table(e, "strata_iq1m_grid_nib_u32", I32, [int(v) for v in GRID_NIB])
    low = e.splat(V16I32, 0x0F0F0F0F)
    accs = []
    for h in range(2):  # groups 0..15, then 16..31
        idx = b.and_(b.bitcast(_multishift(e, IDX_CTRL[h], p), V16I32), e.splat(V16I32, 0x7FF))
        g = _gather(e, grid, idx)
        codes_l = b.and_(g, low)
        codes_h = b.and_(b.lshr(g, e.splat(V16I32, 4)), low)
        x0 = b.bitcast(e.load(px, V64I8, 128 * h), V16I32)
        x1 = b.bitcast(e.load(px, V64I8, 128 * h + 64), V16I32)
        acc = _dpbusd(e, e.splat(V16I32, 0), codes_l, _shuffle2(e, x0, x1, X_LO))
        accs.append(_dpbusd(e, acc, codes_h, _shuffle2(e, x0, x1, X_HI)))
    pu = e._call("llvm.x86.avx512.packssdw.512", V32I16, accs)
    _fence(e, pw)
    sq = b.bitcast(e.bcast(e.load(pw, I64, 48), V8I64), V64I8)  # the scale bytes, every qword
    m1 = b.or_(_words(e, _multishift(e, M1_CTRL, sq), 0x70), e.splat(V32I16, 8))
    ls = b.bitcast(_multishift(e, LS_CTRL, sq), V32I16)
    dl = b.bitcast(_multishift(e, DL_CTRL, p), V32I16)
    idx = b.xor(b.and_(b.xor(ls, dl), e.splat(V32I16, 7)), dl)  # ls bits 0..2, dl's above
    tab = e.const(V32I16, [int(v) for v in M2_TAB])
    m2 = e._call("llvm.x86.avx512.permvar.hi.512", V32I16, [tab, idx])
    x8 = e.load(p8, V32I16)
    acc = b.add(_pmaddwd(e, pu, m1), _pmaddwd(e, x8, m2))
    return e._call("llvm.vector.reduce.add.v16i32", I32, [acc])


def d_bits(e: Emit, pw):
    """The f16 bits of d (the top nibbles of the four scale words) as an i16: one pext (or its
    shifts and masks where the host lacks bmi2)."""
    b = e.b
    words = e.load(pw, I64, 48)
    if "bmi2" in FEATURES:
        mask = ir.Constant(I64, 0xF000F000F000F000 - (1 << 64))
        return b.trunc(e._call("llvm.x86.bmi.pext.64", I64, [words, mask]), I16)
    bits = ir.Constant(I64, 0)
    for k in range(4):  # nibble k: bits 16 k + 12 .. -> 4 k ..
        nib = b.and_(b.lshr(words, ir.Constant(I64, 12 * k + 12)), ir.Constant(I64, 15 << 4 * k))
        bits = b.or_(bits, nib)
    return b.trunc(bits, I16)


@intrinsic
def _blk_iq1_m_avx512(typingctx, w, r, o, xq, a, xo, x8, go):
    """sum_s (2 ls_s + 1) sum_{g in s} (8 sum(grid_g x) + delta_g X8_g) over the IQ1_M block at
    w[r, o:o+56] (s: 16 weights, g: 8 weights)."""
    sig = types.int32(w, types.intp, types.intp, xq, types.intp, types.intp, x8, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        if not HAS_AVX512_VBMI:
            e.trap()
            return ir.Constant(I32, 0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        px = e.ptr(sg.args[3], args[3], args[4], args[5])
        p8 = e.ptr(sg.args[6], args[6], args[4], args[7])
        return block_sum(e, pw, px, p8)

    return sig, codegen


@intrinsic
def _iq1m_d_pext(typingctx, w, r, o):
    """The f16 super-block scale of the IQ1_M block at w[r, o:o+56], as float32 (`iq1.iq1m_d`)."""
    sig = types.float32(w, types.intp, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        if not HAS_AVX512_VBMI:
            e.trap()
            return ir.Constant(ir.FloatType(), 0.0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        _fence(e, pw)  # a load of its own, not the block's broadcast moved through vpbroadcastq
        return f16_to_f32_ir(builder, d_bits(e, pw))

    return sig, codegen


# ---------------------------------------------------------------- row kernel (the float steps of
# iq1.dot_iq1_m, in the same order)


@njit(cache=True)
def dot_iq1_m_avx512(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // BB):
        o = b * BB
        isum = _blk_iq1_m_avx512(w, r, o, xq, a, 256 * b, x8, 32 * b)
        acc += np.float32(xd[a, b] * _iq1m_d_pext(w, r, o)) * np.float32(isum) * np.float32(0.125)
    return acc
