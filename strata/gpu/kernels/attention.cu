// Attention over the f16 KV cache, split along the keys (flash-decoding), for decode and for
// causal prefill, with llama.cpp's roundings: q as f16 values, scores in float32, softmax
// probabilities rounded to f16 *after* normalization (they meet the f16 V as f16).
//
// Because the f16 rounding needs the final max and sum, the probabilities cannot be folded
// online; three launches instead, all deterministic (fixed reduction orders, no atomics):
//   attn_scores   grid (tiles, G, T), block ATT_TILE: one thread per key position computes the
//                 scores of the `rep` query heads sharing its KV head (GQA: K read once), writes
//                 them [T*H, ss] and each tile's (max, sum exp) per head.
//   attn_pv       grid (splits, G, T), block Dv: global max/sum from the tile partials, then
//                 p = f16(exp(s - M) / L) for the split's keys and o_part = sum p * V.
//   attn_combine  grid (T*H), block Dv: o = sum of the split partials (already normalized).
// Query t sees keys 0..pos0+t (causal); S = pos0 + T keys are valid.
#include "common.cuh"

#define ATT_TILE 128
#define ATT_MAX_REP 16
#define ATT_MAX_DH 256

extern "C" __global__ void __launch_bounds__(ATT_TILE)
    attn_scores(const float* __restrict__ q, const u16* __restrict__ k_cache, int S_cap, int Dh,
                int H, int G, int pos0, int S, float scale, float* __restrict__ scores, int ss,
                float* __restrict__ pmax, float* __restrict__ psum, int ntc) {
    __shared__ float qs[ATT_MAX_REP * ATT_MAX_DH];
    __shared__ float red[1024 / STRATA_WARP];
    const int tile = blockIdx.x, g = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int rep = H / G;
    const int s = tile * ATT_TILE + tid;
    for (int k = tid; k < rep * Dh; k += blockDim.x)
        qs[k] = q[((i64)t * H + g * rep) * Dh + k];  // heads g*rep.. are contiguous
    __syncthreads();
    const bool valid = s < S && s <= pos0 + t;
    float acc[ATT_MAX_REP];
#pragma unroll
    for (int r = 0; r < ATT_MAX_REP; ++r) acc[r] = 0.0f;
    if (valid) {
        const u16* kr = k_cache + ((i64)g * S_cap + s) * Dh;
        for (int d = 0; d < Dh; d += 2) {
            const u32 kk = *(const u32*)(kr + d);
            const float k0 = h2f((u16)kk), k1 = h2f((u16)(kk >> 16));
#pragma unroll
            for (int r = 0; r < ATT_MAX_REP; ++r)
                if (r < rep) acc[r] += qs[r * Dh + d] * k0 + qs[r * Dh + d + 1] * k1;
        }
    }
    for (int r = 0; r < rep; ++r) {
        const float sc = valid ? acc[r] * scale : NEG_INF;
        const i64 row = (i64)t * H + g * rep + r;
        if (s < S) scores[row * ss + s] = sc;
        const float m = block_max_f32(sc, red);
        const float e = (valid && m != NEG_INF) ? expf(sc - m) : 0.0f;
        const float l = block_sum_f32(e, red);
        if (tid == 0) {
            pmax[row * ntc + tile] = m;
            psum[row * ntc + tile] = l;
        }
    }
}

extern "C" __global__ void __launch_bounds__(ATT_MAX_DH)
    attn_pv(const float* __restrict__ scores, int ss, const float* __restrict__ pmax,
            const float* __restrict__ psum, int ntc, int ntiles, const u16* __restrict__ v_cache,
            int S_cap, int Dv, int H, int G, int S, int chunk, float* __restrict__ o_part,
            int nsplit) {
    __shared__ float M[ATT_MAX_REP], L[ATT_MAX_REP];
    __shared__ float p[ATT_MAX_REP][ATT_TILE];
    const int split = blockIdx.x, g = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int rep = H / G;
    if (tid < rep) {
        const i64 row = (i64)t * H + g * rep + tid;
        float m = NEG_INF;
        for (int j = 0; j < ntiles; ++j) m = fmaxf(m, pmax[row * ntc + j]);
        float l = 0.0f;
        for (int j = 0; j < ntiles; ++j) {
            const float mj = pmax[row * ntc + j];
            if (mj != NEG_INF) l += psum[row * ntc + j] * expf(mj - m);
        }
        M[tid] = m;
        L[tid] = l;
    }
    __syncthreads();
    float acc[ATT_MAX_REP];
#pragma unroll
    for (int r = 0; r < ATT_MAX_REP; ++r) acc[r] = 0.0f;
    const int s0 = split * chunk, s1 = min(S, s0 + chunk);
    for (int base = s0; base < s1; base += ATT_TILE) {
        const int n = min(ATT_TILE, s1 - base);
        for (int k = tid; k < rep * ATT_TILE; k += blockDim.x) {
            const int r = k / ATT_TILE, i = k % ATT_TILE;
            float pv = 0.0f;
            if (i < n) {
                const float sc = scores[((i64)t * H + g * rep + r) * ss + base + i];
                if (sc != NEG_INF) pv = round_f16(expf(sc - M[r]) / L[r]);
            }
            p[r][i] = pv;
        }
        __syncthreads();
        if (tid < Dv) {
            const u16* vr = v_cache + ((i64)g * S_cap + base) * Dv + tid;
            for (int i = 0; i < n; ++i) {
                const float v = h2f(vr[(i64)i * Dv]);
#pragma unroll
                for (int r = 0; r < ATT_MAX_REP; ++r)
                    if (r < rep) acc[r] += p[r][i] * v;
            }
        }
        __syncthreads();
    }
    if (tid < Dv)
        for (int r = 0; r < rep; ++r)
            o_part[(((i64)t * H + g * rep + r) * nsplit + split) * Dv + tid] = acc[r];
}

extern "C" __global__ void attn_combine(const float* __restrict__ o_part, int nsplit, int Dv,
                                        float* __restrict__ out) {
    const i64 row = blockIdx.x;  // t * H + h
    const int d = threadIdx.x;
    if (d >= Dv) return;
    float o = 0.0f;
    for (int k = 0; k < nsplit; ++k) o += o_part[(row * nsplit + k) * Dv + d];
    out[row * Dv + d] = o;
}
