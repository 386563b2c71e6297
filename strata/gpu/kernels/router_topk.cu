// Router on the device: softmax over all E experts, top-K by probability (ties: lower id),
// optional renormalization of the K weights with the sum clamped below at min_sum (llama.cpp's
// qwen3moe), as strata.routing.route_topk. One warp per token; E <= 32 * WARP_SIZE.
// slot_row (optional): a layer's (expert -> slot) table; then the picks also go out as the
// resident-expert pair list, pair_slot = slot_row[id] (-1: not resident), pair_w = weight (what
// a separate launch used to do).
// gating RT_SOFTMAX_WEIGHT (gpt-oss, strata.routing.topk.topk_softmax_weight): top-K of the
// logits themselves (ties: lower id), the weights a softmax over the K picked logits.
#include "topk.cuh"

#define RT_SOFTMAX 0
#define RT_SOFTMAX_WEIGHT 1

#define RT_C 32  // logits a lane can hold: E <= RT_C * WARP_SIZE

// The body for rows of at most C * WARP_SIZE logits: a lane holds C of them in registers (the
// kernel picks the smallest power-of-two C that fits E, so E = 128 loops over 4, not RT_C).
template <int C>
__device__ __forceinline__ void router_topk_row(const float* __restrict__ l, int E, int K,
                                                int renorm, float min_sum, i64 t,
                                                i32* __restrict__ ids, float* __restrict__ weights,
                                                const i32* __restrict__ slot_row,
                                                i32* __restrict__ pair_slot,
                                                float* __restrict__ pair_w, int gating) {
    const int lane = threadIdx.x;
    const bool sw = gating == RT_SOFTMAX_WEIGHT;  // block-uniform
    // a taken (or absent) expert's value: below every probability, or every logit (sw)
    const float taken = sw ? NEG_INF : -2.0f;
    // the row's probabilities in registers (lane's expert lane + c * WARP_SIZE at p[c]): the K
    // rounds below only shuffle, instead of reloading and exponentiating every logit K times
    float p[C];
    float m = NEG_INF;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int e = lane + c * WARP_SIZE;
        p[c] = e < E ? l[e] : NEG_INF;
        m = fmaxf(m, p[c]);
    }
    m = warp_max(m);
    if (!sw) {
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c)
            if (lane + c * WARP_SIZE < E) s += expf(p[c] - m);
        s = warp_sum(s);
#pragma unroll
        for (int c = 0; c < C; ++c) p[c] = lane + c * WARP_SIZE < E ? expf(p[c] - m) / s : -1.0f;
    }
    float wsum = 0.0f, my_p = 0.0f;
    int my_id = 0;  // lane k keeps pick k: the outputs below go out from K lanes at once
    for (int k = 0; k < K; ++k) {
        float bp = sw ? NEG_INF : -1.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            if (p[c] > bp) {  // taken experts hold `taken`, below any expert's p
                bp = p[c];
                bi = lane + c * WARP_SIZE;
            }
        }
        warp_best(bp, bi);
#pragma unroll
        for (int c = 0; c < C; ++c)
            if (lane + c * WARP_SIZE == bi) p[c] = taken;
        if (lane == k) {
            my_id = bi;
            my_p = bp;
        }
        wsum += bp;
    }
    if (sw) {  // the softmax over the K picks: the first is their max (m, the row's max)
        my_p = lane < K ? expf(my_p - m) : 0.0f;
        wsum = warp_sum(my_p);
    }
    if (lane < K) {
        const i64 j = t * K + lane;
        const float w = sw ? my_p / wsum : renorm ? my_p / fmaxf(wsum, min_sum) : my_p;
        ids[j] = my_id;
        weights[j] = w;
        if (slot_row) {
            pair_slot[j] = slot_row[my_id];
            pair_w[j] = w;
        }
    }
}

extern "C" __global__ void router_topk(const float* __restrict__ logits, int E, int K, int renorm,
                                       float min_sum, i32* __restrict__ ids,
                                       float* __restrict__ weights,
                                       const i32* __restrict__ slot_row,
                                       i32* __restrict__ pair_slot, float* __restrict__ pair_w,
                                       int gating) {
    PDL_ENTER();
    const i64 t = blockIdx.x;
    const float* l = logits + t * E;
    const int c = (E + WARP_SIZE - 1) / WARP_SIZE;  // block-uniform: no divergence
#define RT_ROW(C) \
    router_topk_row<C>(l, E, K, renorm, min_sum, t, ids, weights, slot_row, pair_slot, pair_w, gating)
    if (c <= 1)
        RT_ROW(1);
    else if (c <= 2)
        RT_ROW(2);
    else if (c <= 4)
        RT_ROW(4);
    else if (c <= 8)
        RT_ROW(8);
    else if (c <= 16)
        RT_ROW(16);
    else
        RT_ROW(RT_C);
#undef RT_ROW
}
