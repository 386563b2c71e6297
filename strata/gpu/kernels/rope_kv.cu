// Per-head q/k RMSNorm + NEOX RoPE + f16 KV append, one block per (head, token).
//
// qkv [T, H*Dh + G*Dh + G*Dv] is the fused projection (q heads, then k heads, then v heads).
// q heads -> q_out [T, H, Dh] rounded to f16 values (llama.cpp's attention reads q as f16);
// k heads -> k_cache [G, S_cap, Dh] f16 at position pos0 + t; v heads -> v_cache [G, S_cap, Dv].
// With `pos_dev` (int32 [1] in device memory, not null) the start position is read from there
// instead of `pos0`: the launch is then the same at every position (a CUDA graph replays it).
// RoPE angle (float)pos * inv_freq[i] in float32, as HostTier; no FMA contraction, so a rotated
// value is the same float32 expression numpy evaluates.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(1024)
    qk_norm_rope_kv(const float* __restrict__ qkv, int H, int G, int Dh, int Dv,
                    const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
                    const float* __restrict__ inv_freq, int pos0, float* __restrict__ q_out,
                    u16* __restrict__ k_cache, u16* __restrict__ v_cache, int S_cap,
                    const int* __restrict__ pos_dev) {
    __shared__ double red[1024 / STRATA_WARP];
    const int hh = blockIdx.x, t = blockIdx.y, i = threadIdx.x;
    const int pos = (pos_dev ? pos_dev[0] : pos0) + t;
    const float* row = qkv + (i64)t * (H * Dh + G * Dh + G * Dv);
    if (hh >= H + G) {  // a v head: store as f16
        const int g = hh - H - G;
        if (i < Dv) v_cache[((i64)g * S_cap + pos) * Dv + i] = f2h(row[H * Dh + G * Dh + g * Dv + i]);
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
    if (i >= Dh) return;
    const int half = Dh / 2, j = i < half ? i : i - half;
    const float x0 = nw ? (x[j] * scale) * nw[j] : x[j];
    const float x1 = nw ? (x[j + half] * scale) * nw[j + half] : x[j + half];
    const float theta = (float)pos * inv_freq[j];
    const float c = cosf(theta), s = sinf(theta);
    const float y = i < half ? __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s))
                             : __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
    if (is_q)
        q_out[((i64)t * H + hh) * Dh + i] = round_f16(y);
    else
        k_cache[((i64)(hh - H) * S_cap + pos) * Dh + i] = f2h(y);
}
