"""IQ3_XXS on the GGUF bytes (98 bytes per 256 weights, no repack) with AVX-512 VBMI + VNNI.

For hosts with avx512f/bw/vl/vbmi/vnni (`HAS_AVX512_VBMI`), where the AVX2 gather kernel
(gather.py) is slow and the LUT4 repack reads 1.37x the bytes. One super-block, 512-bit vectors,
no per-weight table loads:

1. grid rows -> level indices. The 64 index bytes G (one load) are permuted once (`PERM`; it
   moves whole dwords, so one vpermd) so that step 2's in-lane unpacks leave the weights in
   natural order. Two 256-entry byte tables give, per index g, A[g] = l0 | l1 << 4 and
   B[g] = l2 | l3 << 4 (lp: the 3-bit level of position p of grid row g, `LEVELS` the eight
   magnitudes); each lookup is two vpermi2b (7-bit index into 128 table bytes) and a select on
   bit 7 of the index.
2. unpack: U = (A, B) byte-interleaved is one 16-bit word l0 | l1 << 4 | l2 << 8 | l3 << 12 per
   g; O = U >> 4 (a word shift) has l1 | l2 << 4 and l3 in its bytes. Interleaving the bytes of
   U and O gives per g the bytes l0 | l1 << 4, l1 | l2 << 4, l2 | l3 << 4, l3: level p in the
   low nibble of byte p, bit 7 clear (levels < 8), so no masking is needed before
3. vpshufb with the 16-entry magnitude table (`MAG`): M_q, u8 magnitudes of weights
   64 q .. 64 q + 63 (q = 0..3), four zmm.
4. signs: the 32 seven-bit ksigns fields of the 8 aux words become 32 bytes with one
   vpmultishiftqb (`SHIFTS`); one vpermi2b through the 128-byte KSIGNS table (it reads 7 index
   bits, so the field's neighbours in bit 7 need no mask) gives the 32 sign bytes S, byte b =
   the signs of weights 8 b .. 8 b + 7. Qword q of S is the sign mask of M_q: a 64-bit k-mask
   (S goes through the stack: one store and four kmovq loads, no shuffle); x_q is negated under
   it (a masked vpsubb; Q8_K quants are within +-127, so exactly).
5. dots: vpdpbusd (u8 M_q x s8 signed x_q, four bytes per int32 lane): lane j of q sums weights
   64 q + 4 j .. + 3, all in sub-block 2 q + j // 8, |lane| <= 4 * 62 * 127 < 2^15. So
   vpackssdw packs two such vectors into int16 exactly, and vpmaddwd with the scales 2 ls + 1
   (`SC_WORDS`: a vpermw of the 8 scales, ((aux >> 27) & 0x1E) | 1) multiplies and adds pairs of
   words of one sub-block; the two int32 results are added and their 16 lanes summed.

The block sum is the portable kernel's `isum`; `dot_iq3_xxs_vbmi` then does the float steps of
`iq3.dot_iq3_xxs` in the same order, so the results are bit-identical to it. The tables above are
module-level arrays, shared with the test's NumPy emulation of these instructions (which runs on
any host; the kernel itself needs the features and traps without them).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.simd import HAS_AVX512_VBMI, I8, I16, I32, V8I32, V32I8, Emit
from strata.cpu.kernels.tables import IQ3XXS_GRID, IQ3XXS_LEVELS, KSIGNS

IQ3_BB = 98
V64I8 = ir.VectorType(I8, 64)
V32I16 = ir.VectorType(I16, 32)
V16I32 = ir.VectorType(I32, 16)
V64I1 = ir.VectorType(ir.IntType(1), 64)
_V4I64 = ir.VectorType(ir.IntType(64), 4)

# ---------------------------------------------------------------- constant tables (uint8)

LEVELS = IQ3XXS_LEVELS.astype(np.uint8)  # [8] the magnitudes 4, 12, ..., 52, 62
_LVL = np.searchsorted(LEVELS, IQ3XXS_GRID).astype(np.uint8)  # [256, 4] level of each position
LUT_A = _LVL[:, 0] | (_LVL[:, 1] << 4)  # [256] l0 | l1 << 4
LUT_B = _LVL[:, 2] | (_LVL[:, 3] << 4)  # [256] l2 | l3 << 4
# byte 16 k + 4 m + t of the permuted indices = G[16 m + 4 k + t] (k: 128-bit lane, m: which of
# the four final unpacks, t: index within it): the swap of two 2-bit fields, an involution
PERM = np.array([((i >> 2) & 3) << 4 | (i >> 4) << 2 | (i & 3) for i in range(64)], np.uint8)
MAG = np.tile(np.concatenate([LEVELS, LEVELS]), 4)  # [64] vpshufb table, per 128-bit lane
# vpmultishiftqb bit offsets: qword k holds aux words 2 k, 2 k + 1; byte 4 s + l = field l of s
SHIFTS = np.array([0, 7, 14, 21, 32, 39, 46, 53] * 4, np.uint8)
KSIGNS_TAB = KSIGNS.astype(np.uint8)  # [128] 7 sign bits + their parity
# vpackssdw(dot_2h, dot_2h+1) word 8 k + i (128-bit lane k) is lane 4 k + i % 4 of dot_2h+i//4,
# whose weights are in sub-block 4 h + 2 (i // 4) + k // 2: the scale each word gets
SC_WORDS = np.array(
    [[4 * h + 2 * (i // 4) + k // 2 for k in range(4) for i in range(8)] for h in range(2)],
    np.int32,
)
# vpunpcklbw / vpunpckhbw of (a, b) as shufflevector masks (b's bytes numbered 64..127)
UNPACK_LO = [x for k in range(4) for t in range(8) for x in (16 * k + t, 64 + 16 * k + t)]
UNPACK_HI = [x for k in range(4) for t in range(8, 16) for x in (16 * k + t, 64 + 16 * k + t)]


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


def _shuffle2(e: Emit, a, b, lanes):
    return e.b.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, len(lanes)), list(lanes)))


def _magnitudes(e: Emit, g):
    """The u8 magnitudes M_0..M_3 (64 weights each, natural order) of the 64 grid indices g."""
    b = e.b
    p = e.shuffle(g, [int(i) for i in PERM])  # vpermd (LLVM sees the dword moves)
    neg = b.icmp_signed("<", p, e.splat(V64I8, 0))
    la, lb = _lut256(e, LUT_A, p, neg), _lut256(e, LUT_B, p, neg)
    mag = e.const(V64I8, _i8(MAG))
    out = []
    for u in (_shuffle2(e, la, lb, UNPACK_LO), _shuffle2(e, la, lb, UNPACK_HI)):
        o = b.bitcast(b.lshr(b.bitcast(u, V32I16), ir.Constant(V32I16, [4] * 32)), V64I8)
        for mask in (UNPACK_LO, UNPACK_HI):
            lv = _shuffle2(e, u, o, mask)
            out.append(e._call("llvm.x86.avx512.pshuf.b.512", V64I8, [mag, lv]))
    return out


def _sign_masks(e: Emit, aux):
    """The four 64-bit sign masks (<64 x i1>, weights 64 q ..) from the 32 aux bytes."""
    b = e.b
    fields = e._call(
        "llvm.x86.avx512.pmultishift.qb.256", V32I8, [e.const(V32I8, _i8(SHIFTS)), aux]
    )
    wide = e.shuffle(fields, list(range(32)) * 2)  # the upper half is not looked at
    ks = [e.const(V64I8, _i8(KSIGNS_TAB[64 * h : 64 * h + 64])) for h in range(2)]
    s = _vpermi2b(e, ks[0], wide, ks[1])
    slot = cgutils.alloca_once(b, _V4I64)  # through memory: kmovq k, m64 (no shuffles)
    b.store(b.bitcast(e.shuffle(s, range(32)), _V4I64), slot)
    # an empty asm that may read the slot: without it LLVM forwards the store to the loads as
    # vmovq/vpextrq/vextracti + kmovq from general registers (twice the uops, most on port 5)
    b.asm(ir.FunctionType(ir.VoidType(), [slot.type]), "", "r,~{memory}", [slot], True)
    base = b.bitcast(slot, ir.IntType(64).as_pointer())
    return [b.bitcast(b.load(b.gep(base, [ir.Constant(I32, q)]), align=8), V64I1) for q in range(4)]


def _scales(e: Emit, aux):
    """The two vpmaddwd multipliers (`SC_WORDS`): word i of h = 2 ls + 1 of sub-block
    SC_WORDS[h, i], as int16."""
    b = e.b
    w = b.bitcast(aux, V8I32)
    sc = b.or_(b.and_(b.lshr(w, e.splat(V8I32, 27)), e.splat(V8I32, 0x1E)), e.splat(V8I32, 1))
    sc = b.bitcast(sc, ir.VectorType(I16, 16))  # word 2 s: sub-block s
    return [e.shuffle(sc, [2 * int(s) for s in SC_WORDS[h]]) for h in range(2)]


def block_acc(e: Emit, pw, px):
    """The block sum as 16 int32 lanes still to be added, from i8* pw (the 98 block bytes) and
    px (its 256 int8 x quants)."""
    b = e.b
    mags = _magnitudes(e, e.load(pw, V64I8, 2))
    aux = e.load(pw, V32I8, 66)
    masks = _sign_masks(e, aux)
    scales = _scales(e, aux)
    zero = e.splat(V16I32, 0)
    dots = []
    for q in range(4):
        x = e.load(px, V64I8, 64 * q)
        xs = b.select(masks[q], b.sub(e.splat(V64I8, 0), x), x)
        dots.append(
            e._call(
                "llvm.x86.avx512.vpdpbusd.512",
                V16I32,
                [zero, b.bitcast(mags[q], V16I32), b.bitcast(xs, V16I32)],
            )
        )
    acc = zero
    for h in range(2):
        pk = e._call("llvm.x86.avx512.packssdw.512", V32I16, dots[2 * h : 2 * h + 2])
        acc = e._call(
            "llvm.x86.avx512.vpdpwssd.512",
            V16I32,
            [acc, b.bitcast(pk, V16I32), b.bitcast(scales[h], V16I32)],
        )
    return acc


def block_sum(e: Emit, pw, px):
    """The int32 block sum from i8* pw (the 98 block bytes) and px (its 256 int8 x quants)."""
    return e._call("llvm.vector.reduce.add.v16i32", I32, [block_acc(e, pw, px)])


@intrinsic
def _blk_iq3_xxs_vbmi(typingctx, w, r, o, xq, a, xo):
    """sum_s (2 ls_s + 1) sum_{i in s} g_i s_i x_i over the IQ3_XXS block at w[r, o:o+98]."""
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
# iq3.dot_iq3_xxs, in the same order)


@njit(cache=True)
def dot_iq3_xxs_vbmi(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // IQ3_BB):
        o = b * IQ3_BB
        isum = _blk_iq3_xxs_vbmi(w, r, o, xq, a, 256 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o)) * np.float32(isum) * np.float32(0.25)
    return acc
