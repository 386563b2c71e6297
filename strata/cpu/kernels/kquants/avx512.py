"""Q4_K, Q5_K and Q6_K on the GGUF bytes (no repack) with AVX-512 VBMI + VNNI.

For hosts with avx512f/bw/vl/vbmi/vnni (`HAS_AVX512_VBMI`), in place of
`avx2.dot_q4_k_avx2` / `dot_q5_k_avx2`, whose block spends two vpmaddubsw, two
vpmaddwd and two scale shuffles a 32-byte load and builds its scale vector from scalar
registers. The Q4_K block: f16 d
(bytes 0, 1), f16 dmin (2, 3), 12 bytes of 6-bit scales and mins (4..15, ggml's k4 packing),
qs[128] (16..143: byte i of 32-byte chunk j holds weight 64 j + i in its low nibble and
64 j + 32 + i in its high one; sub-block s = 32 weights). One super-block:

1. scales and mins: the 12 bytes (one 16-byte xmm load) are unpacked in the vector unit
   (ggml's utmp steps on dwords: two vpshufd, a vpsrlvd / vpsrld, and-or) to S = 8 scales
   then 8 mins, bytes 0..15.
2. dots: chunk j is broadcast into both 256-bit halves (a load); one vpsrlvw (0 bits in the
   low half, 4 in the high) and an and with 0x0F leave the 64 weights 64 j .. 64 j + 63 in
   natural order, so one vpdpbusd takes the natural activation vector x[64 j : 64 j + 64] as a
   memory operand (Q5_K: qh[32], bytes 16..47, broadcast likewise; one vpmultishiftqb a chunk,
   `QH_CTRL`, puts each weight's fifth bit at bit 4, or-ed in under 0x10; qs at 48..175).
   Dword k of it sums weights 64 j + 4 k .. + 3 (sub-block 2 j for k < 8, 2 j + 1 above):
   at most 4 * 31 * 128 = 15872, so vpackssdw of chunks (2 h, 2 h + 1) packs them exactly:
   128-bit lane L of pack h holds four words of sub-block 4 h + (L >= 2), then four of
   4 h + 2 + (L >= 2) (`PACK_SUB`).
3. scales: vpmaddwd of each pack by its words' scales (`SC_IDX`: one zero-masked vpermb of S),
   the two packs' products added (vpdpwssd).
4. mins: sum_s m_s (bsum_2s + bsum_2s+1) as one ymm vpmaddwd of the Q8_K bsums (16 words) by
   the mins spread to their words (`MIN_IDX`, a zero-masked vpermb of S).
5. both sums reduced in one pass: the 16 scale lanes folded to 8, set beside the 8 min lanes,
   and the two 256-bit halves summed within themselves.

The block's (isum, msum) are the AVX2 kernels' exact integers, and the row kernels do the float
steps of `avx2.dot_q4_k_avx2` / `dot_q5_k_avx2` in the same order, so the results are
bit-identical to them (and to the portable `kquants.dot_q4_k` / `dot_q5_k`). Compiled for
Sapphire Rapids the Q4_K block loop is 68 instructions against the AVX2 kernel's 105 (Q5_K 76
against 121). Q6_K (`q6k_block`) follows the same plan with its own bit layout: 61 against 92.
The tables are module-level arrays shared with the test (tests/test_cpu_kquants_avx512.py),
which also checks the compiled asm.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_at
from strata.cpu.kernels.features import HAS_AVX512_VBMI
from strata.cpu.kernels.iq1.avx512 import _dpbusd, _i8, _multishift, _pmaddwd
from strata.cpu.kernels.kquants.portable import Q4K_BB, Q5K_BB, Q6K_BB, kmin_block
from strata.cpu.kernels.simd import I8, I16, I32, Emit

V16I8 = ir.VectorType(I8, 16)
V32I8 = ir.VectorType(I8, 32)
V64I8 = ir.VectorType(I8, 64)
V16I16 = ir.VectorType(I16, 16)
V32I16 = ir.VectorType(I16, 32)
V4I32 = ir.VectorType(I32, 4)
V8I32 = ir.VectorType(I32, 8)
V16I32 = ir.VectorType(I32, 16)

# ---------------------------------------------------------------- constant tables

# k4 unpacking on the dwords (u0, u1, u2) of the 12 scale bytes (ggml's utmp steps):
# out dword = ((A >> UT_SHIFT) & UT_M1) | ((B >> 2) & UT_M2), A = (u0, u2, u1, u2),
# B = (u0, u0, u1, u1): scales 0..3, 4..7, mins 0..3, 4..7
UT_A, UT_B = [0, 2, 1, 2], [0, 0, 1, 1]
UT_SHIFT = np.array([0, 0, 0, 4], np.uint32)
UT_M1 = np.array([0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F], np.uint32)
UT_M2 = np.array([0, 0x30303030, 0, 0x30303030], np.uint32)
# pack h, word 8 L + t (128-bit lane L): sub-block of chunk 2 h (t < 4) or 2 h + 1 (t >= 4)
PACK_SUB = np.array(
    [[4 * h + 2 * (t // 4) + (L >= 2) for L in range(4) for t in range(8)] for h in range(2)]
)
# vpermb of S (bytes 0..7 scales, 8..15 mins) into words: the low byte of each word (the high
# byte zeroed by the mask `WORD_LO`)
SC_IDX = np.array([[s if i % 2 == 0 else 0 for s in sub for i in range(2)] for sub in PACK_SUB])
MIN_IDX = np.array([8 + k // 2 if i % 2 == 0 else 0 for k in range(16) for i in range(2)])
# the dpbusd code vector of a broadcast chunk: word shift 0 (low half) or 4 (high half)
NIB_SHIFT = np.array([0] * 16 + [4] * 16)


def _qh_ctrl(j: int) -> np.ndarray:
    """Q5_K: vpmultishiftqb control that puts, in byte i of chunk j's code vector, the fifth bit
    of its weight (bit 2 j of qh[i] for the low half, 2 j + 1 for the high; qh broadcast into
    both halves) at bit 4: each byte's 8 bits start 4 below it (rotating in the qword)."""
    return np.array([(8 * (i % 8) + 2 * j + (i >= 32) - 4) % 64 for i in range(64)], np.uint8)


QH_CTRL = np.array([_qh_ctrl(j) for j in range(4)])

# Q6_K: chunk c of half h (weights 128 h + 64 c .. + 63) takes its high 2 bits from qh[32 h + i]
# (broadcast into both 256-bit halves) bits 4 c + 2 (i >= 32) and one up: to bits 4, 5
Q6_QH_CTRL = np.array(
    [[(8 * (i % 8) + 4 * c + 2 * (i >= 32) - 4) % 64 for i in range(64)] for c in range(2)],
    np.uint8,
)
# pack h, word 8 L + t: sub-block (16 weights) 8 h + 4 (t >= 4) + L, the index vpermw takes
# from the 16 sign-extended scales
Q6_SC_IDX = np.array(
    [[8 * h + 4 * (t // 4) + L for L in range(4) for t in range(8)] for h in range(2)]
)


# ---------------------------------------------------------------- IR


def _vpermb(e: Emit, idx, data, ty):
    """Bytes data[idx] (vpermb; data <16 x i8> widened) with every odd byte zeroed."""
    n = ty.count
    wide = e.shuffle(data, list(range(16)) + [16] * (n - 16))  # the upper lanes: don't care
    name = "llvm.x86.avx512.permvar.qi.512" if n == 64 else "llvm.x86.avx512.permvar.qi.256"
    v = e._call(name, ty, [wide, e.const(ty, _i8(idx))])
    keep = ir.Constant(ir.VectorType(ir.IntType(1), n), [i % 2 == 0 for i in range(n)])
    return e.b.select(keep, v, e.splat(ty, 0))


def k4_unpack(e: Emit, pw):
    """<16 x i8> S: the 8 scales then the 8 mins of the k4-packed bytes at pw + 4."""
    b = e.b
    v = e.load(pw, V4I32, 4)  # u0, u1, u2 (and 4 bytes of qs, unused)
    a = b.lshr(e.shuffle(v, UT_A), e.const(V4I32, [int(s) for s in UT_SHIFT]))
    c = b.lshr(e.shuffle(v, UT_B), e.splat(V4I32, 2))
    m1 = e.const(V4I32, [int(m) - (1 << 32) if m >= 1 << 31 else int(m) for m in UT_M1])
    m2 = e.const(V4I32, [int(m) for m in UT_M2])
    return b.bitcast(b.or_(b.and_(a, m1), b.and_(c, m2)), V16I8)


def k_block(e: Emit, pw, px, pb, fifth_bit: bool):
    """(isum, msum) as int32s from i8* pw (the 144 bytes of a Q4_K block, or with fifth_bit the
    176 of a Q5_K one), px (its 256 int8 x quants) and pb (its 16 int16 bsums)."""
    b = e.b
    s = k4_unpack(e, pw)
    low = e.splat(V64I8, 0x0F)
    shift = e.const(V32I16, [int(v) for v in NIB_SHIFT])
    qo = 48 if fifth_bit else 16
    qh = e.shuffle(e.load(pw, V32I8, 16), list(range(32)) * 2) if fifth_bit else None
    dots = []
    for j in range(4):
        chunk = e.shuffle(e.load(pw, V32I8, qo + 32 * j), list(range(32)) * 2)  # broadcast
        u = b.and_(b.bitcast(b.lshr(b.bitcast(chunk, V32I16), shift), V64I8), low)
        if fifth_bit:
            u = b.or_(u, b.and_(_multishift(e, QH_CTRL[j], qh), e.splat(V64I8, 0x10)))
        x = e.load(px, V64I8, 64 * j)
        dots.append(_dpbusd(e, e.splat(V16I32, 0), b.bitcast(u, V16I32), b.bitcast(x, V16I32)))
    acc = None
    for h in range(2):
        pk = e._call("llvm.x86.avx512.packssdw.512", V32I16, dots[2 * h : 2 * h + 2])
        p = _pmaddwd(e, pk, b.bitcast(_vpermb(e, SC_IDX[h], s, V64I8), V32I16))
        acc = p if acc is None else b.add(acc, p)
    mins = b.bitcast(_vpermb(e, MIN_IDX, s, V32I8), V16I16)
    mn = e._call("llvm.x86.avx2.pmadd.wd", V8I32, [e.load(pb, V16I16), mins])
    a8 = b.add(e.shuffle(acc, list(range(8))), e.shuffle(acc, list(range(8, 16))))
    z = b.shuffle_vector(a8, mn, ir.Constant(V16I32, list(range(16))))  # isum lanes, msum lanes
    for lanes in (
        [4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11],
        [2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13],
        [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14],
    ):
        z = b.add(z, e.shuffle(z, lanes))
    return b.extract_element(z, ir.Constant(I32, 0)), b.extract_element(z, ir.Constant(I32, 8))


def q6k_block(e: Emit, pw, px, pb):
    """sum_s sc_s (sum q x - 32 bsum_s) as an int32 from i8* pw (the 210 bytes of a Q6_K block:
    ql[128], qh[64], int8 scales[16], f16 d), px (its 256 int8 x quants) and pb (its 16 int16
    bsums). Chunk c of half h: the ql nibbles (low for c = 0, high for c = 1) of the 64 bytes
    ql[64 h ..] are weights 128 h + 64 c .. + 63 in natural order; their high 2 bits come from
    the broadcast qh[32 h ..] by one vpmultishiftqb; a dword of the vpdpbusd is at most
    4 * 63 * 128 = 32256, so vpackssdw packs the two chunks exactly; a 128-bit lane of a chunk's
    dots is one 16-weight sub-block."""
    b = e.b
    sc = b.sext(e.load(pw, V16I8, 192), V16I16)  # the 16 scales
    sc32 = e.shuffle(sc, list(range(16)) + [0] * 16)  # widened (upper lanes: don't care)
    low, hi2 = e.splat(V64I8, 0x0F), e.splat(V64I8, 0x30)
    acc = None
    for h in range(2):
        ql = e.load(pw, V64I8, 64 * h)
        qh = e.shuffle(e.load(pw, V32I8, 128 + 32 * h), list(range(32)) * 2)  # broadcast
        dots = []
        for c in range(2):
            nib = (
                ql
                if c == 0
                else b.bitcast(b.lshr(b.bitcast(ql, V32I16), e.splat(V32I16, 4)), V64I8)
            )
            u = b.or_(b.and_(nib, low), b.and_(_multishift(e, Q6_QH_CTRL[c], qh), hi2))
            x = e.load(px, V64I8, 128 * h + 64 * c)
            dots.append(_dpbusd(e, e.splat(V16I32, 0), b.bitcast(u, V16I32), b.bitcast(x, V16I32)))
        pk = e._call("llvm.x86.avx512.packssdw.512", V32I16, dots)
        sw = e._call(
            "llvm.x86.avx512.permvar.hi.512",
            V32I16,
            [sc32, e.const(V32I16, [int(i) for i in Q6_SC_IDX[h]])],
        )
        p = _pmaddwd(e, pk, sw)
        acc = p if acc is None else b.add(acc, p)
    off = e._call("llvm.x86.avx2.pmadd.wd", V8I32, [e.load(pb, V16I16), sc])  # sum sc_s bsum_s
    a8 = b.add(e.shuffle(acc, list(range(8))), e.shuffle(acc, list(range(8, 16))))
    a8 = b.sub(a8, b.shl(off, e.splat(V8I32, 5)))
    return e._call("llvm.vector.reduce.add.v8i32", I32, [a8])


def _blk_intrinsic(block_fn, pair: bool, doc: str):
    """A Numba intrinsic (w, r, o, xq, a, xo, xb, bo) -> (int32, int32) if pair else int32:
    block_fn(e, pw, px, pb) of the block at w[r, o:] against act row a of xq from xo and of xb
    from bo (a trap where the host lacks the features)."""

    def blk(typingctx, w, r, o, xq, a, xo, xb, bo):
        ret = types.UniTuple(types.int32, 2) if pair else types.int32
        sig = ret(w, types.intp, types.intp, xq, types.intp, types.intp, xb, types.intp)

        def codegen(context, builder, sg, args):
            e = Emit(context, builder)
            if HAS_AVX512_VBMI:
                pw = e.ptr(sg.args[0], args[0], args[1], args[2])
                px = e.ptr(sg.args[3], args[3], args[4], args[5])
                pb = e.ptr(sg.args[6], args[6], args[4], args[7])
                res = block_fn(e, pw, px, pb)
            else:
                e.trap()
                res = (ir.Constant(I32, 0),) * 2 if pair else ir.Constant(I32, 0)
            return context.make_tuple(builder, ret, list(res)) if pair else res

        return sig, codegen

    blk.__doc__ = doc
    return intrinsic(blk)


_blk_q4_k_avx512 = _blk_intrinsic(
    lambda e, pw, px, pb: k_block(e, pw, px, pb, False),
    True,
    "(sum_s sc_s sum q x, sum_s m_s bsum_s) of the Q4_K block at w[r, o:o+144]",
)
_blk_q5_k_avx512 = _blk_intrinsic(
    lambda e, pw, px, pb: k_block(e, pw, px, pb, True),
    True,
    "As `_blk_q4_k_avx512` for the Q5_K block at w[r, o:o+176]",
)
_blk_q6_k_avx512 = _blk_intrinsic(
    q6k_block, False, "sum_s sc_s (sum q x - 32 bsum_s) of the Q6_K block at w[r, o:o+210]"
)


# ---------------------------------------------------------------- row kernels (the float steps of
# avx2.py's, in the same order; one njit function a format, as there: closures made by one
# factory would share a qualified name, and so Numba's on-disk cache entries)


@njit(cache=True)
def dot_q4_k_avx512(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q4K_BB):
        o = b * Q4K_BB
        isum, msum = _blk_q4_k_avx512(w, r, o, xq, a, 256 * b, xb, 16 * b)
        acc += kmin_block(w, r, o, xd[a, b], isum, msum)
    return acc


@njit(cache=True)
def dot_q5_k_avx512(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q5K_BB):
        o = b * Q5K_BB
        isum, msum = _blk_q5_k_avx512(w, r, o, xq, a, 256 * b, xb, 16 * b)
        acc += kmin_block(w, r, o, xd[a, b], isum, msum)
    return acc


@njit(cache=True)
def dot_q6_k_avx512(w, r, xq, xd, xb, x8, xf, a):
    acc = np.float32(0.0)
    for b in range(w.shape[1] // Q6K_BB):
        o = b * Q6K_BB
        isum = _blk_q6_k_avx512(w, r, o, xq, a, 256 * b, xb, 16 * b)
        acc += np.float32(xd[a, b] * f16_at(w, r, o + 208)) * np.float32(isum)
    return acc
