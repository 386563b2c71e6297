// Q8 quantization of one activation row as ggml quantizes a matmul's input (bit-identical to
// strata.quant.activation), by the warps of a block: Q8_K blocks of 256 (d float32) and Q8_0
// blocks of 32 (d an f16 value stored as float). `y(i)` gives element i of the row; q [n] and
// d [n / block] are the row's outputs. Used by norm_quant.cu.
#pragma once
#include "common.cuh"

#define MODE_F32 0
#define MODE_F16 1
#define MODE_Q8_0 8
#define MODE_Q8_K 15
#define MODE_BF16 30

template <class Y>
__device__ __forceinline__ void q8k_row(const Y& y, int n, i8* __restrict__ out_q,
                                        float* __restrict__ out_d, int wid, int nw, int lane) {
    const int nb = n / 256;
    for (int bi = wid; bi < nb; bi += nw) {
        float v[256 / WARP_SIZE];
        float best = -1.0f, bval = 0.0f;
        int bidx = 0x7fffffff;
#pragma unroll
        for (int k = 0; k < 256 / WARP_SIZE; ++k) {
            const int e = bi * 256 + lane + k * WARP_SIZE;
            v[k] = y(e);
            const float a = fabsf(v[k]);
            if (a > best) {  // e grows with k: the first of equal maxima wins
                best = a;
                bidx = e;
                bval = v[k];
            }
        }
#pragma unroll
        for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
            const float ob = SHFL_XOR(best, o), ov = SHFL_XOR(bval, o);
            const int oi = SHFL_XOR(bidx, o);
            if (ob > best || (ob == best && oi < bidx)) {
                best = ob;
                bidx = oi;
                bval = ov;
            }
        }
        const float iscale = best == 0.0f ? 0.0f : -127.0f / bval;
#pragma unroll
        for (int k = 0; k < 256 / WARP_SIZE; ++k) {
            const int e = bi * 256 + lane + k * WARP_SIZE;
            const int q = best == 0.0f ? 0 : min(127, __float2int_rn(iscale * v[k]));
            out_q[e] = (i8)q;
        }
        if (lane == 0) out_d[bi] = best == 0.0f ? 0.0f : 1.0f / iscale;
    }
}

template <class Y>
__device__ __forceinline__ void q8_0_row(const Y& y, int n, i8* __restrict__ out_q,
                                         float* __restrict__ out_d, int wid, int nw, int lane) {
    const int nb = n / 32, per = WARP_SIZE / 32;  // 32-element blocks per warp pass
    const int sub = lane / 32, l = lane % 32, step = nw * per;
    constexpr int P = 4;  // passes whose loads are issued before any of their sums
    for (int base = wid * per; base < nb; base += P * step) {
        float v[P];
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int bi = base + p * step + sub;
            v[p] = bi < nb ? y(bi * 32 + l) : 0.0f;
        }
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int bi = base + p * step + sub;
            float a = fabsf(v[p]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, SHFL_XOR(a, o));
            if (bi < nb) {
                const float d = h2f(f2h(a / 127.0f));
                const float inv = a != 0.0f ? 127.0f / a : 0.0f;
                const int q = max(-128, min(127, __float2int_rn(v[p] * inv)));
                out_q[bi * 32 + l] = (i8)q;
                if (l == 0) out_d[bi] = d;
            }
        }
    }
}
