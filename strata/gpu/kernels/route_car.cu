// Routing and cache-aware routing (CAR) on the device, for decode steps that never wait for the
// host to route: one warp per token.
//   1. softmax over the E router logits -> probs (written out for the host's statistics)
//   2. top-K by probability (ties: lower id), weights renormalized as route_topk does -> ids0, w
//   3. CAR, strata.routing.car's rule: a pick whose expert has no slot (slot_row[e] < 0) may be
//      replaced by the resident expert C the token did not select with the best ratio
//      p_C / max(p_E, tiny) (float64) >= threshold; best ratio first, ties by lower C, then lower
//      E; each C once; at most `budget` substitutions per token unless the ratio >= free_ratio.
//      Taking, at each step, the best pair still applicable (its miss open, its C unused, and
//      free or under budget) is the same as walking the sorted pairs and skipping the others.
//      Slack mode (knobs[4..5]): the `keep` misses of largest probability (ties: lower E) stay
//      for the CPU pool, and so does a miss whose weight p_E / sum of the K picks' p (float64,
//      summed in pick order) is above max_weight; only the others may be substituted. The seeds'
//      rule is keep = 0, max_weight = inf.
//   4. pair_slot[t*K + k] = slot of the final pick (-1: the CPU pool computes it), and
//      stats[t] = (misses before CAR, substitutions, misses after CAR, sum of accepted ratios).
// knobs[6] float64 (device memory, so a captured graph sees updates): threshold, budget,
// free_ratio, on, max_weight, keep.
//   5. pack (may be null): the same plan, plus the token's h row [D] (h_src), as one record of
//      32-bit words per token, ids0 [K] | ids [K] | weights [K] | pair_slot [K] | stats [4] |
//      h [D]: the host reads a decode step's whole plan with one copy. `pack` may point into
//      pinned host memory (a step queued ahead, T = 1): then `ready` (pinned, may be null) gets
//      step[0] once every word of the record is visible to the host.
#include "topk.cuh"

#define RC_MAX_PER_LANE 8  // E <= 8 * WARP_SIZE
#define RC_MAX_K 16

extern "C" __global__ void route_car(const float* __restrict__ logits, int E, int K, int renorm,
                                     float min_sum, const i32* __restrict__ slot_row,
                                     const double* __restrict__ knobs,
                                     float* __restrict__ probs, i32* __restrict__ ids0,
                                     i32* __restrict__ ids, float* __restrict__ weights,
                                     i32* __restrict__ pair_slot, float* __restrict__ stats,
                                     u32* __restrict__ pack, const float* __restrict__ h_src,
                                     int D, volatile i32* ready, const i32* __restrict__ step) {
    PDL_ENTER();
    const int t = blockIdx.x, lane = threadIdx.x;
    const float* l = logits + (i64)t * E;
    float m, s;
    softmax_stats(l, E, m, s);
    float p[RC_MAX_PER_LANE];
#pragma unroll
    for (int c = 0; c < RC_MAX_PER_LANE; ++c) {
        const int e = lane + c * WARP_SIZE;
        p[c] = e < E ? expf(l[e] - m) / s : -1.0f;
        if (e < E) probs[(i64)t * E + e] = p[c];
    }
    // top-K, as router_topk.cu
    u32 taken = 0;
    int pick[RC_MAX_K];
    float pw[RC_MAX_K];
    float wsum = 0.0f;
    for (int k = 0; k < K; ++k) {
        float bp = -1.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int c = 0; c < RC_MAX_PER_LANE; ++c) {
            const int e = lane + c * WARP_SIZE;
            if (e < E && !((taken >> c) & 1u) && p[c] > bp) {
                bp = p[c];
                bi = e;
            }
        }
        warp_best(bp, bi);
        if (bi % WARP_SIZE == lane) taken |= 1u << (bi / WARP_SIZE);
        pick[k] = bi;
        pw[k] = bp;
        wsum += bp;
    }
    const float div = renorm ? fmaxf(wsum, min_sum) : 1.0f;
    // CAR: `taken` marks this lane's selected experts; candidates are resident and not taken
    const double threshold = knobs[0], free_ratio = knobs[2];
    const int budget = (int)knobs[1], on = knobs[3] != 0.0;
    const double max_weight = knobs[4];
    const int keep = (int)knobs[5];
    int misses = 0;
    double mass = 0.0;
    for (int k = 0; k < K; ++k) {
        misses += slot_row[pick[k]] < 0;
        mass += (double)pw[k];
    }
    mass = fmax(mass, 2.2250738585072014e-308);
    u32 shut = 0;  // bit k: a miss slack mode keeps for the pool (or a resident pick)
    for (int k = 0; k < K; ++k) {
        if (slot_row[pick[k]] >= 0 || (double)pw[k] / mass > max_weight) {
            shut |= 1u << k;
            continue;
        }
        int rank = 0;  // heavier misses of the token (ties: lower expert id)
        for (int j = 0; j < K; ++j)
            if (j != k && slot_row[pick[j]] < 0 &&
                (pw[j] > pw[k] || (pw[j] == pw[k] && pick[j] < pick[k])))
                ++rank;
        if (rank < keep) shut |= 1u << k;
    }
    int final_[RC_MAX_K];
    for (int k = 0; k < K; ++k) final_[k] = pick[k];
    u32 used = 0;    // this lane's candidates already taken by a substitution
    u32 done = 0;    // bit k: miss k substituted
    int counted = 0, n_sub = 0;
    double ratio_sum = 0.0;
    if (on && misses > 0) {
        for (int step = 0; step < misses; ++step) {
            // the best applicable (ratio, C, E) over this lane's candidates and all open misses
            double br = -1.0;
            int bc = 0x7fffffff, be = 0x7fffffff, bk = -1;
#pragma unroll
            for (int c = 0; c < RC_MAX_PER_LANE; ++c) {
                const int e = lane + c * WARP_SIZE;
                if (e >= E || ((taken >> c) & 1u) || ((used >> c) & 1u) || slot_row[e] < 0)
                    continue;
                for (int k = 0; k < K; ++k) {
                    if (((done >> k) & 1u) || ((shut >> k) & 1u)) continue;
                    const double pe = fmax((double)pw[k], 2.2250738585072014e-308);
                    const double r = (double)p[c] / pe;
                    if (r < threshold) continue;
                    const bool free = r >= free_ratio;
                    if (budget > 0 && !free && counted >= budget) continue;
                    if (r > br || (r == br && (e < bc || (e == bc && pick[k] < be)))) {
                        br = r;
                        bc = e;
                        be = pick[k];
                        bk = k;
                    }
                }
            }
#pragma unroll
            for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
                const double orr = SHFL_XOR(br, o);
                const int oc = SHFL_XOR(bc, o), oe = SHFL_XOR(be, o), ok = SHFL_XOR(bk, o);
                if (orr > br || (orr == br && (oc < bc || (oc == bc && oe < be)))) {
                    br = orr;
                    bc = oc;
                    be = oe;
                    bk = ok;
                }
            }
            if (bk < 0) break;  // nothing applicable is left
            final_[bk] = bc;
            done |= 1u << bk;
            if (bc % WARP_SIZE == lane) used |= 1u << (bc / WARP_SIZE);
            if (!(br >= free_ratio)) ++counted;
            ++n_sub;
            ratio_sum += (double)(float)br;  // the plan's float32 ratio, summed
        }
    }
    u32* rec = pack ? pack + (i64)t * (4 * K + 4 + D) : nullptr;
    if (rec) {
        const u32* hs = (const u32*)(h_src + (i64)t * D);
        for (int d = lane; d < D; d += WARP_SIZE) rec[4 * K + 4 + d] = hs[d];
    }
    if (lane == 0) {
        int after = 0;
        for (int k = 0; k < K; ++k) {
            const i64 q = (i64)t * K + k;
            ids0[q] = pick[k];
            ids[q] = final_[k];
            weights[q] = pw[k] / div;
            const int sl = slot_row[final_[k]];
            pair_slot[q] = sl;
            after += sl < 0;
            if (rec) {
                rec[k] = (u32)pick[k];
                rec[K + k] = (u32)final_[k];
                rec[2 * K + k] = __float_as_uint(weights[q]);
                rec[3 * K + k] = (u32)sl;
            }
        }
        const float st[4] = {(float)misses, (float)n_sub, (float)after, (float)ratio_sum};
        for (int j = 0; j < 4; ++j) {
            stats[(i64)t * 4 + j] = st[j];
            if (rec) rec[4 * K + j] = __float_as_uint(st[j]);
        }
    }
    if (ready != nullptr) {  // each lane's record words out over the bus before the ready word
        FENCE_SYSTEM();
        __syncthreads();
        if (lane == 0) *ready = step[0];
    }
}
