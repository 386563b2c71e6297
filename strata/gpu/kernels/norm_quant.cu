// RMSNorm (optional) fused with the activation rounding llama.cpp's matmul applies to its input.
//
// One block per row of x [T, n]. y = w ? (x * f32(1/sqrt(mean(x^2) + eps))) * w : x, with the
// mean taken in double as ggml does. Outputs (each optional):
//   out_f  y itself (the normalized activation, unrounded)
//   out_r  y rounded as the weight's vec_dot type sees it (mode F32: y, F16/BF16: rounded)
//   out_q / out_d  y quantized (mode Q8_K: blocks of 256, d float32; Q8_0: blocks of 32, d an
//          f16 value stored as float), bit-identical to strata.quant.activation.
#include "q8_quant.cuh"

__device__ __forceinline__ float nq_y(const float* xr, const float* w, float scale, int i) {
    return w ? (xr[i] * scale) * w[i] : xr[i];
}

struct NqY {  // q8_quant.cuh's source of the row: y = nq_y
    const float* xr;
    const float* w;
    float scale;
    __device__ __forceinline__ float operator()(int i) const { return nq_y(xr, w, scale, i); }
};

extern "C" __global__ void __launch_bounds__(1024)
    norm_quant(const float* __restrict__ x, const float* __restrict__ w, float eps, int n,
               float* __restrict__ out_f, float* __restrict__ out_r, i8* __restrict__ out_q,
               float* __restrict__ out_d, int mode) {
    STRATA_PDL_ENTER();
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
    if (mode == MODE_Q8_K)
        q8k_row(NqY{xr, w, scale}, n, out_q + (i64)t * n, out_d + (i64)t * (n / 256), wid, nw,
                lane);
    else if (mode == MODE_Q8_0)
        q8_0_row(NqY{xr, w, scale}, n, out_q + (i64)t * n, out_d + (i64)t * (n / 32), wid, nw,
                 lane);
}
