// The experts' activation between gate/up and down (experts.cu, experts_grouped.cu): SwiGLU,
// as HostTier silu(g) * u = g / (1 + exp(-g)) * u, or gpt-oss's (act MOE_ACT_OAI, after the
// expert's gate and up biases) min(g, 7) * sigmoid(1.702 min(g, 7)) * (clip(u, -7, 7) + 1)
// (strata/cpu/rope.py swiglu_oai). Expert biases: `bias` [E, 2F + D] float32 of the layer
// (gate [F], up [F], down [D] per expert), indexed by the pair's expert pair_exp[p]; null: none.
#pragma once
#include "common.cuh"

#define MOE_ACT_SILU 0
#define MOE_ACT_OAI 1

__device__ __forceinline__ float moe_glu(float g, float u, const float* __restrict__ bias,
                                         const i32* __restrict__ pair_exp, i64 p, int f, int F,
                                         int D, int act) {
    if (bias) {
        const float* b = bias + (i64)pair_exp[p] * (2 * F + D);
        g += b[f];
        u += b[F + f];
    }
    if (act == MOE_ACT_OAI) {
        const float x = fminf(g, 7.0f), y = fminf(fmaxf(u, -7.0f), 7.0f);
        return x / (1.0f + expf(1.702f * -x)) * (y + 1.0f);
    }
    return g / (1.0f + expf(-g)) * u;
}

// the down bias of pair p at output row d (bias not null)
__device__ __forceinline__ float moe_down_bias(const float* __restrict__ bias,
                                               const i32* __restrict__ pair_exp, i64 p, int d,
                                               int F, int D) {
    return bias[(i64)pair_exp[p] * (2 * F + D) + 2 * F + d];
}
