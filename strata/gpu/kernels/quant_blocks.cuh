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
#define QT_BF16 30

// bytes b of `g` whose bit in the 4-bit `s` is set are negated (values are 1..127: no carries)
__device__ __forceinline__ int apply_signs4(u32 g, u32 s) {
    const u32 t = (s & 1u) | ((s & 2u) << 7) | ((s & 4u) << 14) | ((s & 8u) << 21);
    const u32 m = t * 0xffu;
    return (int)((g ^ m) + (m & 0x01010101u));
}

template <int QT>
struct Fmt;

template <>
struct Fmt<QT_Q8_0> {
    enum { QK = 32, BB = 34, HAS_MIN = 0 };
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        s0 = s1 = h2f(ld_u16(b));
        mn = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = (int)ld_u32_a2(b + 2 + 4 * k);
    }
};

__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <>
struct Fmt<QT_Q4_K> {
    enum { QK = 256, BB = 144, HAS_MIN = 1 };
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        int sc, m;
        scale_min_k4(j, b + 4, sc, m);
        s0 = s1 = h2f(ld_u16(b)) * (float)sc;
        mn = h2f(ld_u16(b + 2)) * (float)m;
        const u8* qs = b + 16 + 32 * (j >> 1);
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) w[k] = (int)((ld_u32_a2(qs + 4 * k) >> sh) & 0x0F0F0F0Fu);
    }
};

template <>
struct Fmt<QT_Q5_K> {
    enum { QK = 256, BB = 176, HAS_MIN = 1 };
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        int sc, m;
        scale_min_k4(j, b + 4, sc, m);
        s0 = s1 = h2f(ld_u16(b)) * (float)sc;
        mn = h2f(ld_u16(b + 2)) * (float)m;
        const u8* qh = b + 16;
        const u8* qs = b + 48 + 32 * (j >> 1);
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const u32 lo = (ld_u32_a2(qs + 4 * k) >> sh) & 0x0F0F0F0Fu;
            const u32 hi = ((ld_u32_a2(qh + 4 * k) >> j) & 0x01010101u) << 4;
            w[k] = (int)(lo | hi);
        }
    }
};

template <>
struct Fmt<QT_Q6_K> {
    enum { QK = 256, BB = 210, HAS_MIN = 0 };
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
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        const int ls = ((b[4 + (j >> 1)] >> (4 * (j & 1))) & 0xF) |
                       (((ld_u16(b + 2) >> (2 * j)) & 3) << 4);
        s0 = s1 = h2f(ld_u16(b)) * (float)(ls - 32);
        mn = 0.0f;
        const u8* qs = b + 8 + 16 * j;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 q = ld_u32_a2(qs + 4 * k);
            u32 lo = 0, hi = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                lo |= (u32)(u8)kvalues_iq4nl[(q >> (8 * i)) & 0xF] << (8 * i);
                hi |= (u32)(u8)kvalues_iq4nl[(q >> (8 * i + 4)) & 0xF] << (8 * i);
            }
            w[k] = (int)lo;
            w[k + 4] = (int)hi;
        }
    }
};

template <>
struct Fmt<QT_IQ3_XXS> {
    enum { QK = 256, BB = 98, HAS_MIN = 0 };
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        const u32 aux = ld_u32_a2(b + 66 + 4 * j);
        s0 = s1 = h2f(ld_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
        mn = 0.0f;
        const u8* qs = b + 2 + 8 * j;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 sg = ksigns_iq2xs[(aux >> (7 * l)) & 127];
            w[2 * l] = apply_signs4(iq3xxs_grid[qs[2 * l]], sg & 15);
            w[2 * l + 1] = apply_signs4(iq3xxs_grid[qs[2 * l + 1]], sg >> 4);
        }
    }
};

template <>
struct Fmt<QT_IQ2_XXS> {
    enum { QK = 256, BB = 66, HAS_MIN = 0 };
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        const u32 a0 = ld_u32_a2(b + 2 + 8 * j), a1 = ld_u32_a2(b + 6 + 8 * j);
        s0 = s1 = h2f(ld_u16(b)) * (0.5f + (float)(a1 >> 28)) * 0.25f;
        mn = 0.0f;
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u64 g = iq2xxs_grid[(a0 >> (8 * l)) & 255];
            const u32 sg = ksigns_iq2xs[(a1 >> (7 * l)) & 127];
            w[2 * l] = apply_signs4((u32)g, sg & 15);
            w[2 * l + 1] = apply_signs4((u32)(g >> 32), sg >> 4);
        }
    }
};

template <>
struct Fmt<QT_IQ2_S> {
    enum { QK = 256, BB = 82, HAS_MIN = 0 };
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        const float d = h2f(ld_u16(b));
        const int sc = b[74 + j];
        s0 = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
        s1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
        mn = 0.0f;
        const int qh = b[66 + j];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int g = 4 * j + l;
            const u64 gr = iq2s_grid[b[2 + g] | (((qh >> (2 * l)) & 3) << 8)];
            const u32 sg = b[34 + g];
            w[2 * l] = apply_signs4((u32)gr, sg & 15);
            w[2 * l + 1] = apply_signs4((u32)(gr >> 32), sg >> 4);
        }
    }
};

template <>
struct Fmt<QT_IQ3_S> {
    enum { QK = 256, BB = 110, HAS_MIN = 0 };
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
        const int sc = (b[106 + (j >> 1)] >> (4 * (j & 1))) & 0xF;
        s0 = s1 = h2f(ld_u16(b)) * (float)(1 + 2 * sc);
        mn = 0.0f;
        const int qh = b[66 + j];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int g = 8 * j + 2 * l;
            const u32 g0 = iq3s_grid[b[2 + g] | (((qh >> (2 * l)) & 1) << 8)];
            const u32 g1 = iq3s_grid[b[3 + g] | (((qh >> (2 * l + 1)) & 1) << 8)];
            const u32 sg = b[74 + 4 * j + l];
            w[2 * l] = apply_signs4(g0, sg & 15);
            w[2 * l + 1] = apply_signs4(g1, sg >> 4);
        }
    }
};

template <>
struct Fmt<QT_IQ1_M> {
    enum { QK = 256, BB = 56, HAS_MIN = 0 };
    static __device__ __forceinline__ void decode(const u8* b, int j, int* w, float& s0,
                                                  float& s1, float& mn) {
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
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const int g = 4 * j + l;
            const int nib = (b[32 + (g >> 1)] >> (4 * (g & 1))) & 0xF;
            const u64 gr = iq1s_grid[b[g] | ((nib & 7) << 8)];
            const int delta = (nib & 8) ? -1 : 1;
            u32 lo = 0, hi = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                lo |= (u32)(u8)(8 * (int)(i8)(gr >> (8 * i)) + delta) << (8 * i);
                hi |= (u32)(u8)(8 * (int)(i8)(gr >> (8 * i + 32)) + delta) << (8 * i);
            }
            w[2 * l] = (int)lo;
            w[2 * l + 1] = (int)hi;
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
#define STRATA_QFORMATS(X) \
    X(q8_0, QT_Q8_0)       \
    X(q4_k, QT_Q4_K)       \
    X(q5_k, QT_Q5_K)       \
    X(q6_k, QT_Q6_K)       \
    X(iq4_xs, QT_IQ4_XS)   \
    X(iq3_xxs, QT_IQ3_XXS) \
    X(iq3_s, QT_IQ3_S)     \
    X(iq2_xxs, QT_IQ2_XXS) \
    X(iq2_s, QT_IQ2_S)     \
    X(iq1_m, QT_IQ1_M)
