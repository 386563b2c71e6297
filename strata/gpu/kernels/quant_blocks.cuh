// GGML weight blocks decoded 32 elements at a time (one "sub-block").
//
// Fmt<QT>::decode(block, j, w, s0, s1, mn) gives sub-block j of a block as 32 small integers
// packed four to an int (w[8], int8 each) and scales so that weight i = s_{i/16} * w_i - mn.
// Every format Strata reads fits that form exactly (IQ1_M's +-1/8 deltas as 8*grid +- 1 with
// the scale / 8), so one integer dot product (dp4a) serves all of them, and the dequantized
// value (deq32) is bit-identical to gguf.quants.dequantize: the same float32 products in the
// same order, with contraction into FMA ruled out.
#pragma once
#include "common.cuh"
#include "iq_tables.cuh"

#define QT_F32 0
#define QT_F16 1
#define QT_Q8_0 8
#define QT_Q4_K 12
#define QT_Q5_K 13
#define QT_Q6_K 14
#define QT_Q8_K 15
#define QT_IQ2_XXS 16
#define QT_IQ3_XXS 18
#define QT_IQ3_S 21
#define QT_IQ2_S 22
#define QT_IQ4_XS 23
#define QT_IQ1_M 29
#define QT_MXFP4 39
#define QT_BF16 30

// How the decode reads its formats (the same integers whichever way; these are the measured
// winners):
// - fewer loads per sub-block: the IQ2/IQ3 sign byte computed (7 bits + parity, ==
//   ksigns_iq2xs[i]) instead of a table lookup, IQ3_XXS's qs read as 16-bit words, Q4_K/Q5_K's
//   6-bit scales without a divergent branch;
// - IQ4_XS's 16 values looked up from four registers by byte permutes (lut16_bytes), IQ1_M's
//   8 * grid +- 1 formed four bytes at a time (SWAR) from one word of the grid;
// - Q8_0's 32 quants read as aligned words funnel-shifted into place (ld_words_a2: 9 loads for
//   its 8 words, not 16): its prompt GEMM 0.8x the time, its attention GEMVs 0.82-0.89x;
// - the IQ2/IQ3 signs of 8 values become two byte masks by two multiplies and two prmt
//   (sign_masks).
// GRID_CODES: the formats (bit QT) whose grid is looked up as selector codes (iq*_code: a nibble
// per value, its index among the format's levels) and formed by byte permutes of the level words:
// tables of half the bytes, one more permute per 4 values. That pays for IQ1_M (16 KiB of u64 rows
// -> 8 KiB) and IQ2_S (8 KiB -> 4 KiB) held in shared memory; the smaller grids' decode is bound by
// its arithmetic and lost up to 14% at lm_head.
#define GRID_CODES ((1ull << 29) | (1ull << 22))
#define GRID_CODES_ON(QT) ((GRID_CODES >> (QT)) & 1ull)
// GRID_SMEM_BYTES: the shared memory a kernel block may spend on one copy of a code table
// (GridTab below); a table past it stays in global memory, a grid read as bytes gets one copy where
// it is 2 KiB at most. One copy of IQ1_M's codes took its MoE layer 0.93x the time of the global
// table's; more copies cost their fill in every block (IQ2_S: two copies 1.12x the time of one).
#define GRID_SMEM_BYTES 8192

__device__ __forceinline__ u32 popc32(u32 v) {
#if defined(__HIP__) || defined(GPU_EMU) || !defined(__CUDA_ARCH__)
    return (u32)__builtin_popcount(v);
#else
    return (u32)__popc(v);
#endif
}

// ksigns_iq2xs[i & 127]: the 7 sign bits and an 8th making the count of set bits even
__device__ __forceinline__ u32 iq_signs(u32 i) {
    const u32 par = popc32(i & 127u) & 1u;
    return (i & 127u) | (par << 7);
}

// the sign masks of 8 values: byte k of m0 (k < 4) / of m1 (byte k - 4) is 0xFF where value k
// is negative. Signs 0-6 are bits 0-6 of s7 (bits above ignored); sign 7 is bit 7 of byte KB of
// s8w (apply_signs8: the sign byte itself, or byte KB of a word of them; apply_signs7p: the
// parity shifted to bit 7, IQ2_XXS / IQ3_XXS).
// s7 * 0x10204080 puts copies of the 7 bits at 7, 14, 21, 28 (7 wide: no overlap, no carry), so
// bit 8k + 7 holds sign k; s7 * 0x01020408 (copies at 3, 10, 17, 24) holds sign k + 4 there. Each
// byte is then filled with its bit 7: prmt's sign mode on CUDA.
template <int KB = 0>
__device__ __forceinline__ void sign_masks(u32 s7, u32 s8w, u32& m0, u32& m1) {
    const u32 v = s7 & 0x7Fu, h0 = v * 0x10204080u, h1 = v * 0x01020408u;
#if !defined(__HIP__) && !defined(GPU_EMU) && defined(__CUDA_ARCH__)
    asm("prmt.b32 %0, %1, 0, 0xBA98;" : "=r"(m0) : "r"(h0));
    // byte 3: the sign of byte KB of s8w (selector 0xC + KB: prmt's byte 4 + KB, sign mode)
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(m1) : "r"(h1), "r"(s8w), "n"(0xCA98 + (KB << 12)));
#else
    m0 = ((h0 >> 7) & 0x01010101u) * 0xFFu;
    m1 = (((h1 >> 7) & 0x00010101u) | (((s8w >> (8 * KB)) << 17) & 0x01000000u)) * 0xFFu;
#endif
}

__device__ __forceinline__ void negate_by(u32 g0, u32 g1, u32 m0, u32 m1, int& w0, int& w1) {
    w0 = (int)((g0 ^ m0) + (m0 & 0x01010101u));  // ~g + 1 where negative (g 1..127: no carries)
    w1 = (int)((g1 ^ m1) + (m1 & 0x01010101u));
}

// w0 = g0 with the bytes negated whose bit in s (bits 0-3) is set, w1 = g1 by bits 4-7
// (values 1..127), s = byte KB of sw.
template <int KB = 0>
__device__ __forceinline__ void apply_signs8(u32 g0, u32 g1, u32 sw, int& w0, int& w1) {
    const u32 s = sw >> (8 * KB);
    u32 m0, m1;
    sign_masks<KB>(s, sw, m0, m1);
    negate_by(g0, g1, m0, m1, w0, w1);
}

// apply_signs8 with the signs ksigns_iq2xs[s7 & 127] (iq_signs: 7 bits and their parity)
__device__ __forceinline__ void apply_signs7p(u32 g0, u32 g1, u32 s7, int& w0, int& w1) {
    u32 m0, m1;
    sign_masks(s7, popc32(s7 & 0x7Fu) << 7, m0, m1);
    negate_by(g0, g1, m0, m1, w0, w1);
}

// A lookup table as a kernel reads it: entry i of copy (lane % C), copies interleaved so that
// lane l's reads fall in bank l % 32 when C = 32 (C = 1: a plain array, as the global tables).
// Words hold one u32 entry, two u16 entries (pairs stay together: a copy is a run of words) or
// half of a u64 one. `p` points at the lane's copy (grid_ref).
template <typename T, int C>
struct GridRef {
    const T* p;
    __device__ __forceinline__ T operator[](u32 i) const {
        if (sizeof(T) == 2) return p[(i & ~1u) * C + (i & 1u)];
        return p[(u64)i * C];
    }
};
template <int C, typename T>
__device__ __forceinline__ GridRef<T, C> grid_ref(const T* base, int lane) {
    const int unit = sizeof(T) == 2 ? 2 : 1;  // entries a copy takes of one interleave step
    return GridRef<T, C>{base + (lane % C) * unit};
}

// byte k of the result = byte (s >> 4k) & 7 of the pair (lo = bytes 0-3, hi = bytes 4-7);
// every selector nibble here is below 8 (PTX prmt's default mode reads bit 3 as "replicate
// the sign", so callers mask it off)
__device__ __forceinline__ u32 perm_bytes(u32 lo, u32 hi, u32 s) {
#if defined(GPU_EMU) || (!defined(__CUDA_ARCH__) && !defined(__HIP__))
    const u64 v = ((u64)hi << 32) | lo;
    u32 r = 0;
    for (int k = 0; k < 4; ++k) r |= (u32)((v >> (8 * ((s >> (4 * k)) & 7u))) & 0xFFu) << (8 * k);
    return r;
#else
    return __byte_perm(lo, hi, s);
#endif
}

// byte k (0-3, a compile-time constant) of q, zero-extended: one byte permute, which the
// compiler then scales into a table address in one multiply-add (a shift and mask take three)
__device__ __forceinline__ u32 byte_of(u32 q, int k) { return perm_bytes(q, 0, 0x4440 + k); }

// byte C of q | byte C of h << 8 (h's bytes below 128): a 9- or 10-bit index by one permute
// (bytes 2-3 from prmt's sign mode on h's byte 0, which is 0)
template <int C>
__device__ __forceinline__ u32 idx_join(u32 q, u32 h) {
#if !defined(__HIP__) && !defined(GPU_EMU) && defined(__CUDA_ARCH__)
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(q), "r"(h), "n"(0xCC00 | ((4 + C) << 4) | C));
    return r;
#else
    return ((q >> (8 * C)) & 0xFFu) | (((h >> (8 * C)) & 0xFFu) << 8);
#endif
}

// four entries of a 16-byte table held in four words (t0: bytes 0-3 .. t3: bytes 12-15),
// looked up by the four indices in the bytes of v (each 0..15): two permutes (the halves of the
// table) and a bytewise select by each index's bit 3
__device__ __forceinline__ u32 lut16_bytes(u32 v, u32 t0, u32 t1, u32 t2, u32 t3) {
    const u32 s = v | (v >> 4);  // nibbles: byte 0 = v0 | v1 << 4, byte 2 = v2 | v3 << 4
    const u32 sel = ((s & 0xFFu) | ((s >> 8) & 0xFF00u)) & 0x7777u;
    const u32 m = ((v >> 3) & 0x01010101u) * 0xFFu;  // bytes whose index is 8..15
    return (perm_bytes(t0, t1, sel) & ~m) | (perm_bytes(t2, t3, sel) & m);
}

// bytewise a + b (mod 256 in each byte: no carry crosses a byte)
__device__ __forceinline__ u32 add_bytes(u32 a, u32 b) {
    return ((a & 0x7F7F7F7Fu) + (b & 0x7F7F7F7Fu)) ^ ((a ^ b) & 0x80808080u);
}

// Fmt<QT>::decode(b, j, w, s0, s1, mn, tab) reads the format's lookup table (tab_t[TAB_N],
// gtab() in global memory) through `tab` (a GridRef), so a kernel may pass shared-memory copies;
// formats without a table ignore it. The six-argument decode reads gtab().
#define FMT_NO_TAB                                                                              \
    typedef u8 tab_t;                                                                           \
    enum { TAB_N = 0 };                                                                         \
    static __device__ __forceinline__ const tab_t* gtab() { return nullptr; }                   \
    template <class G>                                                                          \
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,        \
                                                  float& s1, float& mn, G) {                    \
        decode(b, j, w, s0, s1, mn);                                                            \
    }
#define FMT_TAB(T, N, G)                                                                        \
    typedef T tab_t;                                                                            \
    enum { TAB_N = N };                                                                         \
    static __device__ __forceinline__ const tab_t* gtab() { return G; }                         \
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,        \
                                                  float& s1, float& mn) {                       \
        decode(b, j, w, s0, s1, mn, GridRef<tab_t, 1>{G});                                      \
    }
template <bool B, class X, class Y>
struct Pick {
    typedef X T;
};
template <class X, class Y>
struct Pick<false, X, Y> {
    typedef Y T;
};
// a grid format's table: its codes (type CT) or its bytes (BT), by GRID_CODES
#define FMT_GRID(QT, CT, N, CODE, BT, GRID)                                                     \
    enum { CODES = (int)GRID_CODES_ON(QT) };                                                    \
    typedef typename Pick<CODES != 0, CT, BT>::T grid_t;                                        \
    FMT_TAB(grid_t, N, FMT_GRID_PTR(CODES, CODE, GRID))
#define FMT_GRID_PTR(C, CODE, GRID) ((const tab_t*)((C) ? (const void*)CODE : (const void*)GRID))

// the magnitudes of four grid values from a 16-bit code (bytes of lv0 | lv1 << 32) or, with the
// grid's bytes (C false), the entry itself
template <bool C>
__device__ __forceinline__ u32 grid4(u32 e, u32 lv0, u32 lv1) {
    return C ? perm_bytes(lv0, lv1, e) : e;
}
// ... of eight values (two words), a 32-bit code into one level word, or a u64 grid entry
template <bool C, typename T>
__device__ __forceinline__ void grid8(T e, u32 lv, u32& lo, u32& hi) {
    if (C) {
        lo = perm_bytes(lv, 0u, (u32)e & 0xFFFFu);
        hi = perm_bytes(lv, 0u, (u32)e >> 16);
    } else {
        lo = (u32)e;
        hi = (u32)((u64)e >> 32);
    }
}

template <int QT>
struct Fmt;

template <>
struct Fmt<QT_Q8_0> {
    enum { QK = 32, BB = 34, HAS_MIN = 0 };
    FMT_NO_TAB
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        s0 = s1 = h2f(ld_u16(b));
        mn = 0.0f;
        ld_words_a2<8>(b + 2, (u32*)w);
    }
};

// sub-block j's 6-bit scale and min from its bytes a = q[j & 3], b = q[4 + (j & 3)],
// c = q[8 + (j & 3)] of the 12 scale bytes q: selects, not a branch (the lanes of a warp differ
// in j)
__device__ __forceinline__ void scale_min_k4_abc(int j, int a, int b, int c, int& sc, int& m) {
    const bool lo = j < 4;
    sc = lo ? (a & 63) : ((c & 0xF) | ((a >> 6) << 4));
    m = lo ? (b & 63) : ((c >> 4) | ((b >> 6) << 4));
}

__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int& sc, int& m) {
    scale_min_k4_abc(j, q[j & 3], q[4 + (j & 3)], q[8 + (j & 3)], sc, m);
    return;
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Q4_K / Q5_K: sub-block j's scale and min from the block's first 16 bytes as words hd[4]
// (d, dmin, the 12 scale bytes)
__device__ __forceinline__ void k4_header(int j, const u32* hd, float& s, float& mn) {
    const int sh = 8 * (j & 3);
    int sc, m;
    scale_min_k4_abc(j, (hd[1] >> sh) & 0xFF, (hd[2] >> sh) & 0xFF, (hd[3] >> sh) & 0xFF, sc, m);
    s = h2f((u16)(hd[0] & 0xFFFFu)) * (float)sc;
    mn = h2f((u16)(hd[0] >> 16)) * (float)m;
}

// Q4_K / Q5_K, a 16-byte aligned block b: its header (d, dmin, the 12 scale bytes), Q5_K's 32
// high-bit bytes at qh into h (qh null: none) and the 32 quant bytes at qs as 16-byte loads, in
// that order; sub-block j's scale and min
__device__ __forceinline__ void k4_aligned(const u8* b, const u8* qh, const u8* qs, int j,
                                           u32* h, u32* q, float& s, float& mn) {
    u32 hd[4];
    ld_w4_a16(b, hd);
    if (qh) {
        ld_w4_a16(qh, h);
        ld_w4_a16(qh + 16, h + 4);
    }
    ld_w4_a16(qs, q);
    ld_w4_a16(qs + 16, q + 4);
    k4_header(j, hd, s, mn);
}

// ... and any block (2-byte aligned): the header by 2-byte loads and bytes
__device__ __forceinline__ void k4_scales(const u8* b, int j, float& s, float& mn) {
    int sc, m;
    scale_min_k4(j, b + 4, sc, m);
    s = h2f(ld_u16(b)) * (float)sc;
    mn = h2f(ld_u16(b + 2)) * (float)m;
}

template <>
struct Fmt<QT_Q4_K> {
    enum { QK = 256, BB = 144, HAS_MIN = 1 };
    FMT_NO_TAB
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        const u8* qs = b + 16 + 32 * (j >> 1);
        const int sh = 4 * (j & 1);
        u32 q[8];
        if ((((size_t)b) & 15) == 0) {
            k4_aligned(b, nullptr, qs, j, nullptr, q, s0, mn);
        } else
        {
            k4_scales(b, j, s0, mn);
#pragma unroll
            for (int k = 0; k < 8; ++k) q[k] = ld_u32_a2(qs + 4 * k);
        }
        s1 = s0;
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = (int)((q[k] >> sh) & 0x0F0F0F0Fu);
    }
};

template <>
struct Fmt<QT_Q5_K> {
    enum { QK = 256, BB = 176, HAS_MIN = 1 };
    FMT_NO_TAB
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        const u8* qh = b + 16;
        const u8* qs = b + 48 + 32 * (j >> 1);
        const int sh = 4 * (j & 1);
        u32 h[8], q[8];
        if ((((size_t)b) & 15) == 0) {
            k4_aligned(b, qh, qs, j, h, q, s0, mn);
        } else
        {
            k4_scales(b, j, s0, mn);
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                q[k] = ld_u32_a2(qs + 4 * k);
                h[k] = ld_u32_a2(qh + 4 * k);
            }
        }
        s1 = s0;
#pragma unroll
        for (int k = 0; k < 8; ++k)
            w[k] = (int)(((q[k] >> sh) & 0x0F0F0F0Fu) | (((h[k] >> j) & 0x01010101u) << 4));
    }
};

template <>
struct Fmt<QT_Q6_K> {
    enum { QK = 256, BB = 210, HAS_MIN = 0 };
    FMT_NO_TAB
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        const float d = h2f(ld_u16(b + 208));
        const i8* sc = (const i8*)(b + 192);
        s0 = d * (float)sc[2 * j];
        s1 = d * (float)sc[2 * j + 1];
        mn = 0.0f;
        const int h = j >> 2;
        const u8* ql = b + 64 * h + 32 * (j & 1);
        const u8* qh = b + 128 + 32 * h;
        const int shl = 4 * ((j >> 1) & 1), shh = 2 * (j & 3);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const u32 v = ((ld_u32_a2(ql + 4 * k) >> shl) & 0x0F0F0F0Fu) |
                          (((ld_u32_a2(qh + 4 * k) >> shh) & 0x03030303u) << 4);
            w[k] = (int)((v + 0x60606060u) ^ 0x80808080u);  // bytewise v - 32, no borrows
        }
    }
};

template <>
struct Fmt<QT_IQ4_XS> {
    enum { QK = 256, BB = 136, HAS_MIN = 0 };
    FMT_NO_TAB  // the table is four immediates (iq_tables.cuh's KVALUES_IQ4NL_W*)
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        const u8* qs = b + 8 + 16 * j;
        u32 hd[2], qw[4];
        if ((((size_t)b) & 7) == 0) {  // header and quants as three 8-byte loads
            ld_w2_a8(b, hd);
            ld_w2_a8(qs, qw);
            ld_w2_a8(qs + 8, qw + 2);
        } else
        {
            hd[0] = ld_u32_a2(b);
            hd[1] = ld_u32_a2(b + 4);
#pragma unroll
            for (int k = 0; k < 4; ++k) qw[k] = ld_u32_a2(qs + 4 * k);
        }
        // d, scales_h (16 bits), scales_l (4 bytes): sub-block j's 6-bit scale
        const int ls = ((hd[1] >> (8 * (j >> 1) + 4 * (j & 1))) & 0xF) |
                       (((hd[0] >> (16 + 2 * j)) & 3) << 4);
        s0 = s1 = h2f((u16)(hd[0] & 0xFFFFu)) * (float)(ls - 32);
        mn = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            w[k] = (int)lut16_bytes(qw[k] & 0x0F0F0F0Fu, KVALUES_IQ4NL_W0, KVALUES_IQ4NL_W1,
                                    KVALUES_IQ4NL_W2, KVALUES_IQ4NL_W3);
            w[k + 4] = (int)lut16_bytes((qw[k] >> 4) & 0x0F0F0F0Fu, KVALUES_IQ4NL_W0,
                                        KVALUES_IQ4NL_W1, KVALUES_IQ4NL_W2, KVALUES_IQ4NL_W3);
        }
    }
};

// MXFP4 (gpt-oss experts): an E8M0 byte e, then 16 bytes of E2M1 codes (weight j in the low
// nibble of byte j, weight j + 16 in the high one). ggml's doubled E2M1 values (kvalues_mxfp4,
// four immediates KVALUES_MXFP4_W*) times GGML_E8M0_TO_FP32_HALF(e) = 2**(e - 128). Blocks are
// 17 bytes: a block starts at any byte, so its codes come from aligned words (ld_words_a1).
__device__ __forceinline__ float e8m0_half(u32 e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);  // e < 2: subnormal
}

template <>
struct Fmt<QT_MXFP4> {
    enum { QK = 32, BB = 17, HAS_MIN = 0 };
    FMT_NO_TAB
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        u32 qw[4];
        ld_words_a1<4>(b + 1, qw);
        s0 = s1 = e8m0_half(b[0]);
        mn = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            w[k] = (int)lut16_bytes(qw[k] & 0x0F0F0F0Fu, KVALUES_MXFP4_W0, KVALUES_MXFP4_W1,
                                    KVALUES_MXFP4_W2, KVALUES_MXFP4_W3);
            w[k + 4] = (int)lut16_bytes((qw[k] >> 4) & 0x0F0F0F0Fu, KVALUES_MXFP4_W0,
                                        KVALUES_MXFP4_W1, KVALUES_MXFP4_W2, KVALUES_MXFP4_W3);
        }
    }
};

template <>
struct Fmt<QT_IQ3_XXS> {
    enum { QK = 256, BB = 98, HAS_MIN = 0 };
    FMT_GRID(QT_IQ3_XXS, u16, 256, iq3xxs_code, u32, iq3xxs_grid)
    template <class G>
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn, G grid) {
        const u32 aux = ld_u32_a2(b + 66 + 4 * j);
        s0 = s1 = h2f(ld_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
        mn = 0.0f;
        const u8* qs = b + 2 + 8 * j;
        const u32 qw[2] = {ld_u32_a2(qs), ld_u32_a2(qs + 4)};
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 q = qw[l >> 1], k = 2 * (l & 1);  // this group's 2 index bytes: k, k + 1
            apply_signs7p(grid4<CODES>(grid[byte_of(q, k)], IQ3XXS_LV0, IQ3XXS_LV1),
                          grid4<CODES>(grid[byte_of(q, k + 1)], IQ3XXS_LV0, IQ3XXS_LV1),
                          aux >> (7 * l), w[2 * l], w[2 * l + 1]);
        }
    }
};

template <>
struct Fmt<QT_IQ2_XXS> {
    enum { QK = 256, BB = 66, HAS_MIN = 0 };
    FMT_GRID(QT_IQ2_XXS, u32, 256, iq2xxs_code, u64, iq2xxs_grid)
    template <class G>
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn, G grid) {
        const u32 a0 = ld_u32_a2(b + 2 + 8 * j), a1 = ld_u32_a2(b + 6 + 8 * j);
        s0 = s1 = h2f(ld_u16(b)) * (0.5f + (float)(a1 >> 28)) * 0.25f;
        mn = 0.0f;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            u32 lo, hi;
            grid8<CODES>(grid[byte_of(a0, l)], IQ2_LV0, lo, hi);
            apply_signs7p(lo, hi, a1 >> (7 * l), w[2 * l], w[2 * l + 1]);
        }
    }
};

template <>
struct Fmt<QT_IQ2_S> {
    enum { QK = 256, BB = 82, HAS_MIN = 0 };
    FMT_GRID(QT_IQ2_S, u32, 1024, iq2s_code, u64, iq2s_grid)
    template <class G>
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn, G grid) {
        const float d = h2f(ld_u16(b));
        const int sc = b[74 + j];
        s0 = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
        s1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
        mn = 0.0f;
        // the 4 indices' low bytes, their 2 high bits (qh's field l to bits 0-1 of byte l of h:
        // fields 0 and 2 by one multiply, 1 and 3 by another, so no copies overlap), the 4 sign
        // bytes (index l: byte l)
        const u32 q = ld_u32_a2(b + 2 + 4 * j), sw = ld_u32_a2(b + 34 + 4 * j), qh = b[66 + j];
        const u32 h = (((qh & 0x33u) * 0x1001u) & 0x00030003u) |
                      (((qh & 0xCCu) * 0x40040u) & 0x03000300u);
        group<0>(q, h, sw, grid, w);
        group<1>(q, h, sw, grid, w);
        group<2>(q, h, sw, grid, w);
        group<3>(q, h, sw, grid, w);
    }
    template <int L, class G>
    static __device__ __forceinline__ void group(u32 q, u32 h, u32 sw, G grid, int* w) {
        u32 lo, hi;
        grid8<CODES>(grid[idx_join<L>(q, h)], IQ2_LV0, lo, hi);
        apply_signs8<L>(lo, hi, sw, w[2 * L], w[2 * L + 1]);
    }
};

template <>
struct Fmt<QT_IQ3_S> {
    enum { QK = 256, BB = 110, HAS_MIN = 0 };
    FMT_GRID(QT_IQ3_S, u16, 512, iq3s_code, u32, iq3s_grid)
    template <class G>
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn, G grid) {
        const int sc = (b[106 + (j >> 1)] >> (4 * (j & 1))) & 0xF;
        s0 = s1 = h2f(ld_u16(b)) * (float)(1 + 2 * sc);
        mn = 0.0f;
        // the 8 indices' low bytes (two words), their 9th bits spread to bit 0 of the bytes of
        // h[0] (values 0-3) and h[1] (4-7), the 4 sign bytes (value pair l: byte l)
        const u32 q[2] = {ld_u32_a2(b + 2 + 8 * j), ld_u32_a2(b + 6 + 8 * j)};
        const u32 sw = ld_u32_a2(b + 74 + 4 * j), qh = b[66 + j];
        const u32 h[2] = {((qh & 15u) * 0x00204081u) & 0x01010101u,
                          ((qh >> 4) * 0x00204081u) & 0x01010101u};
        group<0>(q, h, sw, grid, w);
        group<1>(q, h, sw, grid, w);
        group<2>(q, h, sw, grid, w);
        group<3>(q, h, sw, grid, w);
    }
    // values 8 L .. 8 L + 7 of the sub-block: indices 2 L and 2 L + 1
    template <int L, class G>
    static __device__ __forceinline__ void group(const u32 (&q)[2], const u32 (&h)[2], u32 sw,
                                                 G grid, int* w) {
        constexpr int c = 2 * (L & 1);
        const u32 g0 = grid4<CODES>(grid[idx_join<c>(q[L >> 1], h[L >> 1])], IQ3S_LV0, IQ3S_LV1);
        const u32 g1 = grid4<CODES>(grid[idx_join<c + 1>(q[L >> 1], h[L >> 1])], IQ3S_LV0, IQ3S_LV1);
        apply_signs8<L>(g0, g1, sw, w[2 * L], w[2 * L + 1]);
    }
};

template <>
struct Fmt<QT_IQ1_M> {
    enum { QK = 256, BB = 56, HAS_MIN = 0 };
    FMT_GRID(QT_IQ1_M, u32, 2048, iq1s_code, u64, iq1s_grid)
    template <class G>
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn, G grid) {
        const u16 sc0 = ld_u16(b + 48), sc1 = ld_u16(b + 50), sc2 = ld_u16(b + 52),
                  sc3 = ld_u16(b + 54);
        const u16 dbits = (u16)((sc0 >> 12) | ((sc1 >> 8) & 0x00F0) | ((sc2 >> 4) & 0x0F00) |
                                (sc3 & 0xF000));
        const float d = h2f(dbits);
        const u16 word = ld_u16(b + 48 + 2 * (j >> 1));
        const int sh = 6 * (j & 1);
        s0 = d * (float)(2 * ((word >> sh) & 7) + 1) * 0.125f;
        s1 = d * (float)(2 * ((word >> (sh + 3)) & 7) + 1) * 0.125f;
        mn = 0.0f;
        // group l of sub-block j: grid index qs[4j + l] | (nibble l of qh & 7) << 8, the
        // nibble's bit 3 the sign of its delta
        if (CODES) {
            // the code's nibbles (grid + 1: 0, 1, 2) pick 8 * grid + delta from the bytes
            // {delta - 8, delta, delta + 8}
            const u32 qs4 = ld_u32_a2(b + 4 * j), qh = ld_u16(b + 32 + 2 * j);
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const u32 nib = (qh >> (4 * l)) & 0xFu;
                const u32 e = grid[((qs4 >> (8 * l)) & 0xFFu) | ((nib & 7u) << 8)];
                const u32 dw = (nib & 8u) ? 0x0007FFF7u : 0x000901F9u;  // delta -1 : +1
                w[2 * l] = (int)perm_bytes(dw, 0u, e & 0xFFFFu);
                w[2 * l + 1] = (int)perm_bytes(dw, 0u, e >> 16);
            }
        } else {
            // the grid's bytes are -1, 0, 1, so 8 * grid is (g << 3) masked to each byte's top
            // five bits, and 8 * grid + delta one bytewise add
            const u32 qs4 = ld_u32_a2(b + 4 * j), qh = ld_u16(b + 32 + 2 * j);
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const u32 nib = (qh >> (4 * l)) & 0xFu;
                const u64 gr = grid[((qs4 >> (8 * l)) & 0xFFu) | ((nib & 7u) << 8)];
                const u32 dl = (nib & 8u) ? 0xFFFFFFFFu : 0x01010101u;
                w[2 * l] = (int)add_bytes(((u32)gr << 3) & 0xF8F8F8F8u, dl);
                w[2 * l + 1] = (int)add_bytes(((u32)(gr >> 32) << 3) & 0xF8F8F8F8u, dl);
            }
        }
    }
};

// weight i of sub-block j, as gguf.quants.dequantize computes it (bit for bit)
template <int QT>
__device__ __forceinline__ void deq32(const u8* blk, int j, float* out) {
    int w[8];
    float s0, s1, mn;
    Fmt<QT>::decode(blk, j, w, s0, s1, mn);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
        const float q = (float)(i8)(w[i >> 2] >> (8 * (i & 3)));
        const float v = __fmul_rn(i < 16 ? s0 : s1, q);
        out[i] = Fmt<QT>::HAS_MIN ? __fsub_rn(v, mn) : v;
    }
}

// sum_i weight_i * xq_i for one sub-block, xq = 32 int8 activations (8 ints)
template <int QT>
__device__ __forceinline__ float dot32(const int* w, float s0, float s1, float mn, const int* xq) {
    int a = 0, b = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) a = dot4(w[k], xq[k], a);
#pragma unroll
    for (int k = 4; k < 8; ++k) b = dot4(w[k], xq[k], b);
    float r = s0 * (float)a + s1 * (float)b;
    if (Fmt<QT>::HAS_MIN) {
        int sx = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) sx = sum4(xq[k], sx);
        r -= mn * (float)sx;
    }
    return r;
}

// every quantized format Strata has kernels for, as one X-macro: X(name, QT)
#define QFORMATS(X)        \
    X(q8_0, QT_Q8_0)       \
    X(q4_k, QT_Q4_K)       \
    X(q5_k, QT_Q5_K)       \
    X(q6_k, QT_Q6_K)       \
    X(iq4_xs, QT_IQ4_XS)   \
    X(iq3_xxs, QT_IQ3_XXS) \
    X(iq3_s, QT_IQ3_S)     \
    X(iq2_xxs, QT_IQ2_XXS) \
    X(iq2_s, QT_IQ2_S)     \
    X(iq1_m, QT_IQ1_M)     \
    X(mxfp4, QT_MXFP4)

// ---- staged decode (decode-sized GEMVs: T <= 8) ----
// A warp copies the bytes of WARP_SIZE consecutive sub-blocks of a row (a "chunk": whole blocks)
// into its own shared memory with 16-byte loads, then each lane decodes its sub-block from there.
// The global reads are then whole 512-byte lines per warp instruction instead of one 2-byte word
// per lane at a block's stride; the decode's many small loads hit shared memory. The copy keeps
// the source's offset mod 16 (blocks are only 2-byte aligned), reading at most 15 bytes either
// side of the chunk within its 16-byte-aligned span (inside the allocation: it is 256-aligned).

#if defined(__HIP__)
#define WARP_SYNC()                                          \
    do {                                                     \
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront"); \
        __builtin_amdgcn_wave_barrier();                     \
        __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront"); \
    } while (0)
#elif defined(GPU_EMU)
#define WARP_SYNC() emu::syncwarp()
#elif !defined(__CUDA_ARCH__)
#define WARP_SYNC() \
    do {            \
    } while (0)
#else
#define WARP_SYNC() __syncwarp()
#endif

template <int QT>
struct Stage {
    enum {
        CB = (WARP_SIZE * 32 / Fmt<QT>::QK) * Fmt<QT>::BB,  // bytes of one chunk
        BUF = (CB + 30) / 16 * 16,                             // + up to 15 bytes of offset
        NV = (BUF / 16 + WARP_SIZE - 1) / WARP_SIZE,       // 16-byte loads per lane
    };
    // bytes of chunk c of a row of nsub sub-blocks (the last one may be short: whole blocks)
    static __device__ __forceinline__ int bytes(int nsub, int c) {
        const int n = min(nsub - c * WARP_SIZE, WARP_SIZE);
        return n * 32 / Fmt<QT>::QK * Fmt<QT>::BB;
    }
};

__device__ __forceinline__ int stage_off(const u8* g) { return (int)((u64)g & 15u); }

// the 16-byte words of [g, g + n) into registers (lane's share), then into shared memory
template <int NV>
__device__ __forceinline__ void stage_load(i32x4* v, const u8* __restrict__ g, int n, int lane) {
    const int o = stage_off(g), nv = (o + n + 15) >> 4;
    const i32x4* src = (const i32x4*)(g - o);
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int i = lane + k * WARP_SIZE;
        if (i < nv) v[k] = src[i];
    }
}

// returns where the chunk's first byte lands in `sm` (16-byte aligned buffer)
template <int NV>
__device__ __forceinline__ const u8* stage_store(u8* sm, const i32x4* v, const u8* g, int n,
                                                 int lane) {
    const int o = stage_off(g), nv = (o + n + 15) >> 4;
    i32x4* dst = (i32x4*)sm;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
        const int i = lane + k * WARP_SIZE;
        if (i < nv) dst[i] = v[k];
    }
    return sm + o;
}

// How a block holds format QT's lookup table with BYTES of shared memory to spend: one copy
// (GridRef) of the code table (GRID_CODES) where it fits, or, with the grids' bytes, one copy of a
// table of at most 2 KiB; C = 0: the global table.
template <int QT, int BYTES = GRID_SMEM_BYTES>
struct GridTab {
    typedef typename Fmt<QT>::tab_t T;
    enum {
        TB = Fmt<QT>::TAB_N * (int)sizeof(T),  // bytes of one copy
        C = TB == 0               ? 0
            : !GRID_CODES_ON(QT)  ? (TB <= 2048 ? 1 : 0)
            : TB <= BYTES         ? 1
                                  : 0,
        COPIES = C > 0 ? C : 1,
        N = C > 0 ? Fmt<QT>::TAB_N * C : 1,  // entries of the kernel's shared array (1: unused)
        USE = C > 0
    };
    typedef GridRef<T, COPIES> Ref;
    struct alignas(16) Store {  // a kernel's __shared__ array for stage_tab
        T v[N];
    };
};

// words of a table a thread of stage_tab loads before it stores any: 4 let IQ1_M's 8 KiB of
// codes into shared memory at 0.93x the layer's MoE time, where one word at a time took 1.25x.
#define TAB_BATCH 4

// the table decode reads: the block's shared copies (filled by all its threads, then a
// barrier) where GridTab<QT, BYTES>::USE, else the global table; every thread of the block must
// call it. `sm`: a GridTab::Store's entries.
template <int QT, int BYTES = GRID_SMEM_BYTES>
__device__ __forceinline__ typename GridTab<QT, BYTES>::Ref stage_tab(
    typename Fmt<QT>::tab_t* sm) {
    typedef GridTab<QT, BYTES> GT;
    typedef typename GT::T T;
    if (GT::USE) {
        // copy c of interleave unit e (U words: a u16 pair, a u32, a u64) at words
        // (e * C + c) * U ..
        enum { U = sizeof(T) == 8 ? 2 : 1, NW = GT::TB / 4 * GT::C, CU = GT::C * U };
        const u32* src = (const u32*)Fmt<QT>::gtab();
        u32* dst = (u32*)sm;
        {  // R words a thread loads before it stores any
            enum { R = TAB_BATCH };
            for (int d0 = threadIdx.x; d0 < NW; d0 += R * blockDim.x) {
                u32 v[R];
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    const int d = d0 + k * blockDim.x;
                    if (d < NW) v[k] = src[(d / CU) * U + d % U];
                }
#pragma unroll
                for (int k = 0; k < R; ++k) {
                    const int d = d0 + k * blockDim.x;
                    if (d < NW) dst[d] = v[k];
                }
            }
        }
        __syncthreads();
        return grid_ref<GT::COPIES>((const T*)sm, (int)(threadIdx.x % WARP_SIZE));
    }
    return typename GT::Ref{Fmt<QT>::gtab()};
}

// acc[m] += sum over sub-blocks sb of dx(sb) * dot(row m, x) for M rows sharing one activation
// (xq int8 [nsub * 32], xd its scales, one per 32 << xd_shift), chunks c0, c0 + cstep, ...;
// lane l takes sub-block c * WARP_SIZE + l, in the same order (and float operations) as a
// one-warp-per-row loop over sb = lane, lane + WARP_SIZE, ... `sm` holds M * Stage::BUF bytes
// of this warp. Chunk c + cstep is read into registers while chunk c is decoded.
template <int QT, int M, class G>
__device__ __forceinline__ void staged_rows(u8* sm, const u8* const* rows, int nsub, int c0,
                                            int cstep, const i8* __restrict__ xq,
                                            const float* __restrict__ xd, int xd_shift,
                                            const G tab, float* acc) {
    typedef Stage<QT> S;
    const int lane = threadIdx.x % WARP_SIZE, spb = Fmt<QT>::QK / 32;
    const int nch = (nsub + WARP_SIZE - 1) / WARP_SIZE;
    i32x4 v[M][S::NV];
    if (c0 < nch) {
        const int n = S::bytes(nsub, c0);
#pragma unroll
        for (int m = 0; m < M; ++m) stage_load<S::NV>(v[m], rows[m] + c0 * S::CB, n, lane);
    }
    for (int c = c0; c < nch; c += cstep) {
        const int n = S::bytes(nsub, c);
        const u8* blk[M];
#pragma unroll
        for (int m = 0; m < M; ++m)
            blk[m] = stage_store<S::NV>(sm + m * S::BUF, v[m], rows[m] + c * S::CB, n, lane);
        WARP_SYNC();
        if (c + cstep < nch) {
            const int n2 = S::bytes(nsub, c + cstep);
#pragma unroll
            for (int m = 0; m < M; ++m)
                stage_load<S::NV>(v[m], rows[m] + (c + cstep) * S::CB, n2, lane);
        }
        const int sb = c * WARP_SIZE + lane;
        if (sb < nsub) {
            const i32x4* xp = (const i32x4*)(xq + (i64)sb * 32);
            const i32x4 a = xp[0], b = xp[1];
            const int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            const float dx = xd[sb >> xd_shift];
            const int boff = (lane / spb) * Fmt<QT>::BB, j = lane % spb;
#pragma unroll
            for (int m = 0; m < M; ++m) {
                int w[8];
                float s0, s1, mn;
                Fmt<QT>::decode(blk[m] + boff, j, w, s0, s1, mn, tab);
                acc[m] += dx * dot32<QT>(w, s0, s1, mn, xv);
            }
        }
        WARP_SYNC();  // the next chunk overwrites `sm`
    }
}
