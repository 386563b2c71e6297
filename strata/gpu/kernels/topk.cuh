// Pieces of the router's softmax + top-K shared by router_topk.cu and route_car.cu: one warp
// per token row, ties to the lower expert id (strata.routing.route_topk's order).
#pragma once
#include "common.cuh"

// max and sum of exp(l - max) over the E logits of one row (every lane gets both)
__device__ __forceinline__ void softmax_stats(const float* __restrict__ l, int E, float& m,
                                              float& s) {
    const int lane = threadIdx.x % WARP_SIZE;
    m = NEG_INF;
    for (int e = lane; e < E; e += WARP_SIZE) m = fmaxf(m, l[e]);
    m = warp_max(m);
    s = 0.0f;
    for (int e = lane; e < E; e += WARP_SIZE) s += expf(l[e] - m);
    s = warp_sum(s);
}

// the warp's best (probability, id) of the lanes' candidates, ties to the lower id; every lane
// ends with the winner
__device__ __forceinline__ void warp_best(float& bp, int& bi) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        const float op = SHFL_XOR(bp, o);
        const int oi = SHFL_XOR(bi, o);
        if (op > bp || (op == bp && oi < bi)) {
            bp = op;
            bi = oi;
        }
    }
}
