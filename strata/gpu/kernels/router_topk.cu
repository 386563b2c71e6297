// Router on the device: softmax over all E experts, top-K by probability (ties: lower id),
// optional renormalization of the K weights with the sum clamped below at min_sum (llama.cpp's
// qwen3moe), as strata.routing.route_topk. One warp per token; E <= 32 * STRATA_WARP.
#include "common.cuh"

extern "C" __global__ void router_topk(const float* __restrict__ logits, int E, int K, int renorm,
                                       float min_sum, i32* __restrict__ ids,
                                       float* __restrict__ weights) {
    const int t = blockIdx.x, lane = threadIdx.x;
    const float* l = logits + (i64)t * E;
    float m = NEG_INF;
    for (int e = lane; e < E; e += STRATA_WARP) m = fmaxf(m, l[e]);
    m = warp_max(m);
    float s = 0.0f;
    for (int e = lane; e < E; e += STRATA_WARP) s += expf(l[e] - m);
    s = warp_sum(s);
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
#pragma unroll
        for (int o = STRATA_WARP / 2; o > 0; o >>= 1) {
            const float op = SHFL_XOR(bp, o);
            const int oi = SHFL_XOR(bi, o);
            if (op > bp || (op == bp && oi < bi)) {
                bp = op;
                bi = oi;
            }
        }
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
