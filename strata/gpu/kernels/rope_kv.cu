// Per-head q/k RMSNorm + NEOX RoPE + KV append (f16, or int8 with a scale per row), one block
// per (head, token).
//
// qkv [T, H*Dh + G*Dh + G*Dv] is the fused projection (q heads, then k heads, then v heads).
// q heads -> q_out [T, H, Dh] rounded to f16 values (llama.cpp's attention reads q as f16);
// k heads -> k_cache [G, S_cap, Dh] f16 at position pos0 + t; v heads -> v_cache [G, S_cap, Dv].
// With `pos_dev` (int32 [1] in device memory, not null) the start position is read from there
// instead of `pos0`: the launch is then the same at every position (a CUDA graph replays it).
// RoPE angle (float)pos * inv_freq[i] in float32, as HostTier; no FMA contraction, so a rotated
// value is the same float32 expression numpy evaluates. RoPE scaling (strata/cpu/rope.py's
// RopeTable): with fs != 1 the angle is fs * theta, with `ramp` (YaRN, not null) then
// mixed as theta_s * (1 - ramp[i]) + theta * ramp[i]; cos and sin times mscale.
//
// int8 cache (qk_norm_rope_kv_i8): a k or v row of a token and KV head is stored as quants
// q = rint(x / d) (round to nearest even, |q| <= 127) with d = absmax(x) / 127 in
// k_scale/v_scale [G, S_cap] (float32; d = 0 and q = 0 for a zero row): strata.gpu.rope_kv's
// quantize_kv_rows, operation for operation. K is quantized from its float32 rotated value.
#include "common.cuh"

// the int8 store of one row: x (0 past D) of thread i of the block, every thread calling it
__device__ __forceinline__ void store_row_i8(i8* __restrict__ cache, float* __restrict__ scales,
                                             i64 r, int D, float x, float* red) {
    const float amax = block_max_f32(fabsf(x), red);
    const float d = amax / 127.0f;  // correctly rounded divisions, as numpy's
    const int i = threadIdx.x;
    if (i < D) cache[r * D + i] = d != 0.0f ? (i8)max(-127, min(127, __float2int_rn(x / d))) : 0;
    if (i == 0) scales[r] = d;
}

template <bool I8>
__device__ __forceinline__ void rope_kv(const float* __restrict__ qkv, int H, int G, int Dh, int Dv,
                                        const float* __restrict__ q_norm,
                                        const float* __restrict__ k_norm, float eps,
                                        const float* __restrict__ inv_freq,
                                        const float* __restrict__ ramp, float fs, float mscale,
                                        int pos0,
                                        float* __restrict__ q_out, void* __restrict__ k_cache,
                                        void* __restrict__ v_cache, float* __restrict__ k_scale,
                                        float* __restrict__ v_scale, int S_cap,
                                        const int* __restrict__ pos_dev) {
    __shared__ double red[1024 / WARP_SIZE];
    const int hh = blockIdx.x, t = blockIdx.y, i = threadIdx.x;
    const int pos = (pos_dev ? pos_dev[0] : pos0) + t;
    const float* row = qkv + (i64)t * (H * Dh + G * Dh + G * Dv);
    if (hh >= H + G) {  // a v head: store as f16 (or int8)
        const int g = hh - H - G;
        if (!I8) {
            u16* vc = (u16*)v_cache;
            if (i < Dv)
                vc[((i64)g * S_cap + pos) * Dv + i] = f2h(row[H * Dh + G * Dh + g * Dv + i]);
        } else {
            const float x = i < Dv ? row[H * Dh + G * Dh + g * Dv + i] : 0.0f;
            store_row_i8((i8*)v_cache, v_scale, (i64)g * S_cap + pos, Dv, x, (float*)red);
        }
        return;
    }
    const bool is_q = hh < H;
    const float* x = is_q ? row + hh * Dh : row + H * Dh + (hh - H) * Dh;
    const float* nw = is_q ? q_norm : k_norm;
    float scale = 1.0f;
    if (nw) {  // block-uniform branch: every thread reaches the reduction
        double ss = 0.0;
        for (int k = i; k < Dh; k += blockDim.x) ss += (double)x[k] * (double)x[k];
        ss = block_sum_f64(ss, red);
        scale = (float)(1.0 / sqrt(ss / (double)Dh + (double)eps));
    }
    if (!I8 && i >= Dh) return;
    // int8: a k head's threads past Dh stay for the row's absmax (they rotate dim 0, carry 0)
    const int ii = I8 && i >= Dh ? 0 : i;
    const int half = Dh / 2, j = ii < half ? ii : ii - half;
    const float x0 = nw ? (x[j] * scale) * nw[j] : x[j];
    const float x1 = nw ? (x[j + half] * scale) * nw[j + half] : x[j + half];
    const float te = __fmul_rn((float)pos, inv_freq[j]);
    float theta = te;
    if (fs != 1.0f) {
        theta = __fmul_rn(fs, te);
        if (ramp)
            theta = __fadd_rn(__fmul_rn(theta, __fsub_rn(1.0f, ramp[j])), __fmul_rn(te, ramp[j]));
    }
    float c = cosf(theta), s = sinf(theta);
    if (mscale != 1.0f) c = __fmul_rn(c, mscale), s = __fmul_rn(s, mscale);
    const float y = ii < half ? __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s))
                              : __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    if (is_q) {
        if (!I8 || i < Dh) q_out[((i64)t * H + hh) * Dh + i] = round_f16(y);
    } else if (!I8) {
        ((u16*)k_cache)[((i64)(hh - H) * S_cap + pos) * Dh + i] = f2h(y);
    } else {  // block-uniform (a k head): every thread reaches the absmax
        store_row_i8((i8*)k_cache, k_scale, (i64)(hh - H) * S_cap + pos, Dh, i < Dh ? y : 0.0f,
                     (float*)red);
    }
}

extern "C" __global__ void __launch_bounds__(1024)
    qk_norm_rope_kv(const float* __restrict__ qkv, int H, int G, int Dh, int Dv,
                    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
                    const float* __restrict__ inv_freq, const float* __restrict__ ramp, float fs,
                    float mscale, int pos0, float* __restrict__ q_out, u16* __restrict__ k_cache,
                    u16* __restrict__ v_cache, int S_cap, const int* __restrict__ pos_dev) {
    PDL_ENTER();
    rope_kv<false>(qkv, H, G, Dh, Dv, q_norm, k_norm, eps, inv_freq, ramp, fs, mscale, pos0, q_out,
                   k_cache, v_cache, nullptr, nullptr, S_cap, pos_dev);
}

extern "C" __global__ void __launch_bounds__(1024)
    qk_norm_rope_kv_i8(const float* __restrict__ qkv, int H, int G, int Dh, int Dv,
                       const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                       float eps, const float* __restrict__ inv_freq,
                       const float* __restrict__ ramp, float fs, float mscale, int pos0,
                       float* __restrict__ q_out, i8* __restrict__ k_cache,
                       i8* __restrict__ v_cache, float* __restrict__ k_scale,
                       float* __restrict__ v_scale, int S_cap, const int* __restrict__ pos_dev) {
    PDL_ENTER();
    rope_kv<true>(qkv, H, G, Dh, Dv, q_norm, k_norm, eps, inv_freq, ramp, fs, mscale, pos0, q_out,
                  k_cache, v_cache, k_scale, v_scale, S_cap, pos_dev);
}
