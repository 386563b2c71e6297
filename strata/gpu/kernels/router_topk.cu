// Router on the device: softmax over all E experts, top-K by probability (ties: lower id),
// optional renormalization of the K weights with the sum clamped below at min_sum (llama.cpp's
// qwen3moe), as strata.routing.route_topk. One warp per token; E <= 32 * STRATA_WARP.
#include "topk.cuh"

extern "C" __global__ void router_topk(const float* __restrict__ logits, int E, int K, int renorm,
                                       float min_sum, i32* __restrict__ ids,
                                       float* __restrict__ weights) {
    const int t = blockIdx.x, lane = threadIdx.x;
    const float* l = logits + (i64)t * E;
    float m, s;
    softmax_stats(l, E, m, s);
    u32 taken = 0;  // bit c: expert lane + c * STRATA_WARP already picked
    float wsum = 0.0f;
    for (int k = 0; k < K; ++k) {
        float bp = -1.0f;
        int bi = 0x7fffffff;
        for (int e = lane, c = 0; e < E; e += STRATA_WARP, ++c) {
            const float p = expf(l[e] - m) / s;
            if (!((taken >> c) & 1u) && p > bp) {
                bp = p;
                bi = e;
            }
        }
        warp_best(bp, bi);
        if (bi % STRATA_WARP == lane) taken |= 1u << (bi / STRATA_WARP);
        if (lane == 0) {
            ids[(i64)t * K + k] = bi;
            weights[(i64)t * K + k] = bp;
        }
        wsum += bp;
    }
    if (renorm && lane == 0) {
        const float div = fmaxf(wsum, min_sum);
        for (int k = 0; k < K; ++k) weights[(i64)t * K + k] /= div;
    }
}
