// Attention over the f16 KV cache, split along the keys (flash-decoding), for decode and for
// causal prefill, with llama.cpp's roundings: q as f16 values, scores in float32, softmax
// probabilities rounded to f16 *after* normalization (they meet the f16 V as f16).
//
// Because the f16 rounding needs the final max and sum, the probabilities cannot be folded
// online; three launches instead, all deterministic (fixed reduction orders, no atomics):
//   attn_scores   grid (tiles, G, T), block ATT_TILE: the tile's keys are staged in shared
//                 memory with coalesced 16-byte loads, then one thread per key computes the
//                 scores of the `rep` query heads sharing its KV head (GQA: K read once),
//                 writes them [T*H, ss] and the tile's (max, sum exp) per head.
//   attn_pv       grid (splits, G, T), block Dv: global max/sum from the tile partials, then
//                 per V tile (staged like K) p = f16(exp(s - M) / L) and o_part += p * V.
//   attn_combine  grid (T*H), block Dv: o = sum of the split partials (already normalized).
// Query t sees keys 0..pos0+t (causal); S = pos0 + T keys are valid. Dh, Dv <= ATT_MAX_DH and
// multiples of 8; H / G <= ATT_MAX_REP (accumulators past rep are computed, never stored).
#include "common.cuh"

#define ATT_TILE 64
#define ATT_MAX_REP 16
#define ATT_MAX_DH 128

// rows [s0, s0 + n) of a [S_cap, D] f16 cache (D multiple of 8) into shared memory, row
// stride `ld` words (u32), by 16-byte loads spread over the block
__device__ __forceinline__ void stage_rows(const u16* __restrict__ src, int D, int n, u32* dst,
                                           int ld) {
    const int chunks = D / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < n * chunks; c += blockDim.x) {
        const int row = c / chunks, col = c - row * chunks;
        const i32x4 v = *(const i32x4*)(src + (i64)row * D + col * 8);
        u32* d = dst + row * ld + col * 4;
        d[0] = (u32)v.x;
        d[1] = (u32)v.y;
        d[2] = (u32)v.z;
        d[3] = (u32)v.w;
    }
}

extern "C" __global__ void __launch_bounds__(ATT_TILE)
    attn_scores(const float* __restrict__ q, const u16* __restrict__ k_cache, int S_cap, int Dh,
                int H, int G, int pos0, int S, float scale, float* __restrict__ scores, int ss,
                float* __restrict__ pmax, float* __restrict__ psum, int ntc) {
    __shared__ f32x4 qs4[ATT_MAX_REP * ATT_MAX_DH / 4];
    __shared__ u32 ks[ATT_TILE * (ATT_MAX_DH / 2 + 1)];  // +1 word per row: no bank conflicts
    float* qs = (float*)qs4;
    __shared__ float red[1024 / STRATA_WARP];
    const int tile = blockIdx.x, g = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int rep = H / G, ld = Dh / 2 + 1;
    const int s0 = tile * ATT_TILE, s = s0 + tid;
    for (int k = tid; k < rep * Dh; k += blockDim.x)
        qs[k] = q[((i64)t * H + g * rep) * Dh + k];  // heads g*rep.. are contiguous
    stage_rows(k_cache + ((i64)g * S_cap + s0) * Dh, Dh, min(ATT_TILE, S - s0), ks, ld);
    __syncthreads();
    const bool valid = s < S && s <= pos0 + t;
    float acc[ATT_MAX_REP];
#pragma unroll
    for (int r = 0; r < ATT_MAX_REP; ++r) acc[r] = 0.0f;
    if (valid) {
        const u32* kr = ks + tid * ld;
        for (int w = 0; w < Dh / 2; w += 2) {  // 4 dims a step: one 16-byte q load per head
            const u32 ka = kr[w], kb = kr[w + 1];
            const float k0 = h2f((u16)ka), k1 = h2f((u16)(ka >> 16));
            const float k2 = h2f((u16)kb), k3 = h2f((u16)(kb >> 16));
#pragma unroll
            for (int r = 0; r < ATT_MAX_REP; ++r) {
                if (r < rep) {
                    const f32x4 qv = qs4[(r * Dh) / 4 + w / 2];
                    acc[r] += qv.x * k0 + qv.y * k1 + qv.z * k2 + qv.w * k3;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_MAX_REP; ++r) {
        if (r < rep) {  // block-uniform
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
}

extern "C" __global__ void __launch_bounds__(ATT_MAX_DH)
    attn_pv(const float* __restrict__ scores, int ss, const float* __restrict__ pmax,
            const float* __restrict__ psum, int ntc, int ntiles, const u16* __restrict__ v_cache,
            int S_cap, int Dv, int H, int G, int S, int chunk, float* __restrict__ o_part,
            int nsplit) {
    __shared__ float M[ATT_MAX_REP], L[ATT_MAX_REP];
    __shared__ f32x4 p4[ATT_TILE * ATT_MAX_REP / 4];  // p[i][r]: a key's rep probabilities
    float* p = (float*)p4;
    __shared__ u32 vs[ATT_TILE * (ATT_MAX_DH / 2)];
    __shared__ float red[1024 / STRATA_WARP];
    const int split = blockIdx.x, g = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int rep = H / G;
    for (int r = 0; r < rep; ++r) {  // global max and sum of one head, the block together
        const i64 row = (i64)t * H + g * rep + r;
        float m = NEG_INF;
        for (int j = tid; j < ntiles; j += blockDim.x) m = fmaxf(m, pmax[row * ntc + j]);
        m = block_max_f32(m, red);
        float l = 0.0f;
        for (int j = tid; j < ntiles; j += blockDim.x) {
            const float mj = pmax[row * ntc + j];
            if (mj != NEG_INF) l += psum[row * ntc + j] * expf(mj - m);
        }
        l = block_sum_f32(l, red);
        if (tid == 0) {
            M[r] = m;
            L[r] = l;
        }
    }
    __syncthreads();
    float acc[ATT_MAX_REP];
#pragma unroll
    for (int r = 0; r < ATT_MAX_REP; ++r) acc[r] = 0.0f;
    const int s0 = split * chunk, s1 = min(S, s0 + chunk);
    const u16* vh = (const u16*)vs;
    for (int base = s0; base < s1; base += ATT_TILE) {
        const int n = min(ATT_TILE, s1 - base);
        stage_rows(v_cache + ((i64)g * S_cap + base) * Dv, Dv, n, vs, Dv / 2);
        for (int k = tid; k < rep * ATT_TILE; k += blockDim.x) {
            const int r = k / ATT_TILE, i = k % ATT_TILE;
            float pv = 0.0f;
            if (i < n) {
                const float sc = scores[((i64)t * H + g * rep + r) * ss + base + i];
                if (sc != NEG_INF) pv = round_f16(expf(sc - M[r]) / L[r]);
            }
            p[i * ATT_MAX_REP + r] = pv;
        }
        __syncthreads();
        if (tid < Dv) {
            for (int i = 0; i < n; ++i) {
                const float v = h2f(vh[i * Dv + tid]);
#pragma unroll
                for (int j = 0; j < ATT_MAX_REP / 4; ++j) {
                    if (4 * j < rep) {
                        const f32x4 pv = p4[i * (ATT_MAX_REP / 4) + j];
                        acc[4 * j] += pv.x * v;
                        acc[4 * j + 1] += pv.y * v;
                        acc[4 * j + 2] += pv.z * v;
                        acc[4 * j + 3] += pv.w * v;
                    }
                }
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
