// RMSNorm (optional) fused with the activation rounding llama.cpp's matmul applies to its input.
//
// One block per row of x [T, n]. y = w ? (x * f32(1/sqrt(mean(x^2) + eps))) * w : x, with the
// mean taken in double as ggml does. Outputs (each optional):
//   out_f  y itself (the normalized activation, unrounded)
//   out_r  y rounded as the weight's vec_dot type sees it (mode F32: y, F16/BF16: rounded)
//   out_q / out_d  y quantized (mode Q8_K: blocks of 256, d float32; Q8_0: blocks of 32, d an
//          f16 value stored as float), bit-identical to strata.quant.activation.
#include "common.cuh"

#define MODE_F32 0
#define MODE_F16 1
#define MODE_Q8_0 8
#define MODE_Q8_K 15
#define MODE_BF16 30

__device__ __forceinline__ float nq_y(const float* xr, const float* w, float scale, int i) {
    return w ? (xr[i] * scale) * w[i] : xr[i];
}

extern "C" __global__ void __launch_bounds__(1024)
    norm_quant(const float* __restrict__ x, const float* __restrict__ w, float eps, int n,
               float* __restrict__ out_f, float* __restrict__ out_r, i8* __restrict__ out_q,
               float* __restrict__ out_d, int mode) {
    __shared__ double red[1024 / STRATA_WARP];
    const int t = blockIdx.x, tid = threadIdx.x;
    const int lane = tid % STRATA_WARP, wid = tid / STRATA_WARP, nw = blockDim.x / STRATA_WARP;
    const float* xr = x + (i64)t * n;
    float scale = 1.0f;
    if (w) {
        double ss = 0.0;
        for (int i = tid; i < n; i += blockDim.x) {
            const double v = (double)xr[i];
            ss += v * v;
        }
        ss = block_sum_f64(ss, red);
        scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    }
    if (out_f || out_r) {
        for (int i = tid; i < n; i += blockDim.x) {
            const float y = nq_y(xr, w, scale, i);
            if (out_f) out_f[(i64)t * n + i] = y;
            if (out_r)
                out_r[(i64)t * n + i] =
                    mode == MODE_F16 ? round_f16(y) : (mode == MODE_BF16 ? round_bf16(y) : y);
        }
    }
    if (mode == MODE_Q8_K) {
        const int nb = n / 256;
        for (int bi = wid; bi < nb; bi += nw) {
            float v[256 / STRATA_WARP];
            float best = -1.0f, bval = 0.0f;
            int bidx = 0x7fffffff;
#pragma unroll
            for (int k = 0; k < 256 / STRATA_WARP; ++k) {
                const int e = bi * 256 + lane + k * STRATA_WARP;
                v[k] = nq_y(xr, w, scale, e);
                const float a = fabsf(v[k]);
                if (a > best) {  // e grows with k: the first of equal maxima wins
                    best = a;
                    bidx = e;
                    bval = v[k];
                }
            }
#pragma unroll
            for (int o = STRATA_WARP / 2; o > 0; o >>= 1) {
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
            for (int k = 0; k < 256 / STRATA_WARP; ++k) {
                const int e = bi * 256 + lane + k * STRATA_WARP;
                const int q = best == 0.0f ? 0 : min(127, __float2int_rn(iscale * v[k]));
                out_q[(i64)t * n + e] = (i8)q;
            }
            if (lane == 0) out_d[(i64)t * nb + bi] = best == 0.0f ? 0.0f : 1.0f / iscale;
        }
    } else if (mode == MODE_Q8_0) {
        const int nb = n / 32, per = STRATA_WARP / 32;  // 32-element blocks per warp pass
        const int sub = lane / 32, l = lane % 32;
        for (int base = wid * per; base < nb; base += nw * per) {
            const int bi = base + sub;
            const bool ok = bi < nb;
            const float v = ok ? nq_y(xr, w, scale, bi * 32 + l) : 0.0f;
            float a = fabsf(v);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, SHFL_XOR(a, o));
            if (ok) {
                const float d = h2f(f2h(a / 127.0f));
                const float inv = a != 0.0f ? 127.0f / a : 0.0f;
                const int q = max(-128, min(127, __float2int_rn(v * inv)));
                out_q[(i64)t * n + bi * 32 + l] = (i8)q;
                if (l == 0) out_d[(i64)t * nb + bi] = d;
            }
        }
    }
}
