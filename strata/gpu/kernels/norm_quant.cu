// RMSNorm (optional) fused with the activation rounding llama.cpp's matmul applies to its input.
//
// One block per row of x [T, n]. y = w ? (x * f32(1/sqrt(mean(x^2) + eps))) * w : x, with the
// mean taken in double as ggml does. Outputs (each optional):
//   out_f  y itself (the normalized activation, unrounded)
//   out_r  y rounded as the weight's vec_dot type sees it (mode F32: y, F16/BF16: rounded)
//   out_q / out_d  y quantized (mode Q8_K: blocks of 256, d float32; Q8_0: blocks of 32, d an
//          f16 value stored as float), bit-identical to strata.quant.activation.
//
// Fast path (latency: a decode row is one block): each thread owns NQ_V contiguous elements per
// chunk, up to NQ_CMAX chunks; x and w are read once, as 16-byte loads all issued up front, and
// everything after (one f64 block sum, the Q8 maxima by shuffles, 16/8-byte stores) works from
// registers. A Q8_0 block is 4 adjacent lanes, a Q8_K block one 32-lane group. Rows it cannot
// take (n % 8, misaligned pointers, n > NQ_V * NQ_CMAX * blockDim) go through the generic path.
#include "q8_quant.cuh"

#define NQ_V 8     // contiguous elements per thread and chunk (two float4)
#define NQ_CMAX 4  // chunks per thread: the launcher's blockDim makes 1 the common case

__device__ __forceinline__ float nq_y(const float* xr, const float* w, float scale, int i) {
    return w ? (xr[i] * scale) * w[i] : xr[i];
}

struct NqY {  // q8_quant.cuh's source of the row: y = nq_y
    const float* xr;
    const float* w;
    float scale;
    __device__ __forceinline__ float operator()(int i) const { return nq_y(xr, w, scale, i); }
};

__device__ __forceinline__ void nq_ld8(float* v, const float* p) {
    const f32x4 a = ((const f32x4*)p)[0], b = ((const f32x4*)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void nq_st8(float* p, const float* v) {
    ((f32x4*)p)[0] = f32x4{v[0], v[1], v[2], v[3]};
    ((f32x4*)p)[1] = f32x4{v[4], v[5], v[6], v[7]};
}

// Q8_K of the 8 elements v of this lane; the 32 lanes of its aligned lane group hold the block.
// ggml's rule: the FIRST element of largest |y| (sign kept) maps to -127. The lane's candidate
// and the group's winner travel as one u64 key: |y| bits, then 255 - index (ties: lower index
// wins), then the sign.
__device__ __forceinline__ void nq_q8k(const float* v, int l32, bool ok, i8* q, float* d) {
    float best = fabsf(v[0]);
    int k0 = 0;
#pragma unroll
    for (int k = 1; k < NQ_V; ++k) {
        if (fabsf(v[k]) > best) {  // strict: the first of equal maxima stays
            best = fabsf(v[k]);
            k0 = k;
        }
    }
    float vk = v[0];
#pragma unroll
    for (int k = 1; k < NQ_V; ++k) vk = k == k0 ? v[k] : vk;
    u64 key = ((u64)__float_as_uint(best) << 32) | ((u64)(255 - (l32 * NQ_V + k0)) << 1) |
              (u64)(__float_as_uint(vk) >> 31);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {  // within the 32-lane group (wave64 holds two blocks)
        const u64 ok2 = SHFL_XOR(key, o);
        key = ok2 > key ? ok2 : key;
    }
    best = __uint_as_float((u32)(key >> 32));
    const float vmax = (key & 1) ? -best : best;
    const float iscale = best == 0.0f ? 0.0f : -127.0f / vmax;
    u32 lo = 0, hi = 0;
#pragma unroll
    for (int k = 0; k < NQ_V; ++k) {
        const int qk = best == 0.0f ? 0 : min(127, __float2int_rn(iscale * v[k]));
        if (k < 4)
            lo |= (u32)(u8)(i8)qk << (8 * k);
        else
            hi |= (u32)(u8)(i8)qk << (8 * (k - 4));
    }
    if (ok) {
        *(u64*)q = (u64)lo | ((u64)hi << 32);
        if (l32 == 0) *d = best == 0.0f ? 0.0f : 1.0f / iscale;
    }
}

// Q8_0 of the 8 elements v of this lane; 4 aligned lanes hold the block of 32.
__device__ __forceinline__ void nq_q8_0(const float* v, int l4, bool ok, i8* q, float* d) {
    float a = fabsf(v[0]);
#pragma unroll
    for (int k = 1; k < NQ_V; ++k) a = fmaxf(a, fabsf(v[k]));
    a = fmaxf(a, SHFL_XOR(a, 2));
    a = fmaxf(a, SHFL_XOR(a, 1));
    const float inv = a != 0.0f ? 127.0f / a : 0.0f;
    u32 lo = 0, hi = 0;
#pragma unroll
    for (int k = 0; k < NQ_V; ++k) {
        const int qk = max(-128, min(127, __float2int_rn(v[k] * inv)));
        if (k < 4)
            lo |= (u32)(u8)(i8)qk << (8 * k);
        else
            hi |= (u32)(u8)(i8)qk << (8 * (k - 4));
    }
    if (ok) {
        *(u64*)q = (u64)lo | ((u64)hi << 32);
        if (l4 == 0) *d = h2f(f2h(a / 127.0f));
    }
}

template <int C>
__device__ __forceinline__ void nq_fast(const float* __restrict__ xr, const float* __restrict__ w,
                                        float eps, int n, float* __restrict__ of,
                                        float* __restrict__ orr, i8* __restrict__ oq,
                                        float* __restrict__ od, int mode, double* red) {
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, wid = tid / WARP_SIZE;
    const int nw = blockDim.x / WARP_SIZE, stride = NQ_V * blockDim.x;
    constexpr bool WPRE = C <= 2;  // 4 chunks of x and w would not fit 64 registers
    float v[C][NQ_V], wv[C][NQ_V];
#pragma unroll
    for (int c = 0; c < C; ++c) {  // every load before any arithmetic
        const int e = c * stride + tid * NQ_V;
        if (e < n) {
            nq_ld8(v[c], xr + e);
            if (WPRE && w) nq_ld8(wv[c], w + e);
        } else {
#pragma unroll
            for (int k = 0; k < NQ_V; ++k) v[c][k] = wv[c][k] = 0.0f;
        }
    }
    if (w) {
        double ss = 0.0;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            double s[NQ_V];
#pragma unroll
            for (int k = 0; k < NQ_V; ++k) s[k] = (double)v[c][k] * (double)v[c][k];
#pragma unroll
            for (int h = NQ_V / 2; h > 0; h >>= 1)  // pairwise: a short dependency chain
#pragma unroll
                for (int k = 0; k < h; ++k) s[k] += s[k + h];
            ss += s[0];
        }
        ss = warp_sum(ss);
        if (nw > 1) {  // one smem round; each warp then sums the partials by the same tree
            if (lane == 0) red[wid] = ss;
            __syncthreads();
            int p = 1;
            while (p < nw) p <<= 1;
            const int j = lane % p;
            ss = j < nw ? red[j] : 0.0;
            for (int o = p / 2; o > 0; o >>= 1) ss += SHFL_XOR(ss, o);
        }
        const float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const int e = c * stride + tid * NQ_V;
            if (!WPRE && e < n) nq_ld8(wv[c], w + e);
#pragma unroll
            for (int k = 0; k < NQ_V; ++k) v[c][k] = (v[c][k] * scale) * wv[c][k];
        }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int e = c * stride + tid * NQ_V;
        if (e < n) {
            if (of) nq_st8(of + e, v[c]);
            if (orr) {
                float r[NQ_V];
#pragma unroll
                for (int k = 0; k < NQ_V; ++k)
                    r[k] = mode == MODE_F16 ? round_f16(v[c][k])
                                            : (mode == MODE_BF16 ? round_bf16(v[c][k]) : v[c][k]);
                nq_st8(orr + e, r);
            }
        }
        // every lane takes part in the shuffles; only whole blocks inside the row are written
        if (mode == MODE_Q8_K) {
            const int b = e / 256;
            nq_q8k(v[c], lane % 32, (b + 1) * 256 <= n, oq + e, od + b);
        } else if (mode == MODE_Q8_0) {
            const int b = e / 32;
            nq_q8_0(v[c], lane % 4, (b + 1) * 32 <= n, oq + e, od + b);
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    norm_quant(const float* __restrict__ x, const float* __restrict__ w, float eps, int n,
               float* __restrict__ out_f, float* __restrict__ out_r, i8* __restrict__ out_q,
               float* __restrict__ out_d, int mode) {
    PDL_ENTER();
    __shared__ double red[1024 / WARP_SIZE];
    const int t = blockIdx.x, tid = threadIdx.x;
    const int lane = tid % WARP_SIZE, wid = tid / WARP_SIZE, nw = blockDim.x / WARP_SIZE;
    const float* xr = x + (i64)t * n;
    const u64 a16 = (u64)x | (u64)w | (u64)out_f | (u64)out_r;
    if (n % NQ_V == 0 && n <= NQ_V * NQ_CMAX * (int)blockDim.x && (a16 & 15) == 0 &&
        ((u64)out_q & 7) == 0) {
        float* of = out_f ? out_f + (i64)t * n : nullptr;
        float* orr = out_r ? out_r + (i64)t * n : nullptr;
        i8* oq = out_q ? out_q + (i64)t * n : nullptr;
        float* od = out_d ? out_d + (i64)t * (mode == MODE_Q8_K ? n / 256 : n / 32) : nullptr;
        const int chunks = (n + NQ_V * blockDim.x - 1) / (NQ_V * blockDim.x);
        if (chunks == 1)
            nq_fast<1>(xr, w, eps, n, of, orr, oq, od, mode, red);
        else if (chunks == 2)
            nq_fast<2>(xr, w, eps, n, of, orr, oq, od, mode, red);
        else
            nq_fast<NQ_CMAX>(xr, w, eps, n, of, orr, oq, od, mode, red);
        return;
    }
    // generic path: any n and alignment, elements strided over the block
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
