// Resident experts for many tokens (prefill): the (token, slot) pairs grouped by expert, so one
// decode of a weight sub-block serves up to MOE_NT tokens instead of one (experts.cu reads each
// expert once per pair).
//   A tile is up to MOE_NT pairs of one expert slot: tile_slot[i], its pairs
//   pair_order[tile_first[i] .. + tile_n[i]] (pair p = t*K + k: token t = p / K).
//   moe_gate_up_tiles grid (F / warps, tiles): act[p, f] = silu(gate) * up, each (row, pair) summed
//                     in experts.cu's order (lane-strided sub-blocks, then a warp sum): the same
//                     bits as moe_gate_up.
//   moe_down_tiles    grid (D / warps, tiles): y[p, d] = down_slot(act_q[p])[d] per pair.
//   ntiles (optional, last argument of both): the tile count on the card (group_pairs.cu); the
//                     grid then holds a bound of it and the blocks past the count return.
//   bias, pair_exp, act (the last arguments): gpt-oss's expert biases and activation as in
//                     experts.cu (moe_glu.cuh); a pair's down bias joins y after its sum.
//   moe_sum_pairs     grid (D / threads, T): out[t, d] = sum_k w[t*K + k] * y[t*K + k, d] in k
//                     order, skipping pairs with slot < 0 (deterministic, no atomics).
#include "moe_glu.cuh"
#include "quant_blocks.cuh"

#define MOE_NT 8

template <int QT>
__device__ __forceinline__ void moe_gate_up_tiles(
    const u8* __restrict__ gate, const u8* __restrict__ up, i64 slot_stride,
    const i8* __restrict__ hq, const float* __restrict__ hd, int xd_shift,
    const i32* __restrict__ tile_slot, const i32* __restrict__ tile_first,
    const i32* __restrict__ tile_n, const i32* __restrict__ pair_order, int K,
    float* __restrict__ act, int F, int D, const float* __restrict__ bias,
    const i32* __restrict__ pair_exp, int act_kind) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int f = blockIdx.x * (blockDim.x / WARP_SIZE) + wid;
    const int tile = blockIdx.y;
    if (f >= F) return;
    const int slot = tile_slot[tile], first = tile_first[tile], n = tile_n[tile];
    const int nsub = D / 32, spb = Fmt<QT>::QK / 32, nxd = nsub >> xd_shift;
    const i64 row_bytes = (i64)(D / Fmt<QT>::QK) * Fmt<QT>::BB;
    const u8* gr = gate + slot * slot_stride + f * row_bytes;
    const u8* ur = up + slot * slot_stride + f * row_bytes;
    i64 tok[MOE_NT];
#pragma unroll
    for (int k = 0; k < MOE_NT; ++k) tok[k] = k < n ? pair_order[first + k] / K : 0;
    float ag[MOE_NT], au[MOE_NT];
#pragma unroll
    for (int k = 0; k < MOE_NT; ++k) ag[k] = au[k] = 0.0f;
    for (int sb = lane; sb < nsub; sb += WARP_SIZE) {
        int wg[8], wu[8];
        float g0, g1, gm, u0, u1, um;
        const i64 boff = (i64)(sb / spb) * Fmt<QT>::BB;
        Fmt<QT>::decode(gr + boff, sb % spb, wg, g0, g1, gm);
        Fmt<QT>::decode(ur + boff, sb % spb, wu, u0, u1, um);
#pragma unroll
        for (int k = 0; k < MOE_NT; ++k) {
            if (k < n) {
                const i32x4* xp = (const i32x4*)(hq + tok[k] * D + sb * 32);
                const i32x4 a = xp[0], b = xp[1];
                const int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                const float dx = hd[tok[k] * nxd + (sb >> xd_shift)];
                ag[k] += dx * dot32<QT>(wg, g0, g1, gm, xv);
                au[k] += dx * dot32<QT>(wu, u0, u1, um, xv);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < MOE_NT; ++k) {
        if (k < n) {
            const float g = warp_sum(ag[k]), u = warp_sum(au[k]);
            const i64 p = pair_order[first + k];
            if (lane == 0) act[p * F + f] = moe_glu(g, u, bias, pair_exp, p, f, F, D, act_kind);
        }
    }
}

template <int QT>
__device__ __forceinline__ void moe_down_tiles(
    const u8* __restrict__ down, i64 slot_stride, const i8* __restrict__ aq,
    const float* __restrict__ ad, int xd_shift, const i32* __restrict__ tile_slot,
    const i32* __restrict__ tile_first, const i32* __restrict__ tile_n,
    const i32* __restrict__ pair_order, float* __restrict__ y, int D, int F,
    const float* __restrict__ bias, const i32* __restrict__ pair_exp) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int d = blockIdx.x * (blockDim.x / WARP_SIZE) + wid;
    const int tile = blockIdx.y;
    if (d >= D) return;
    const int slot = tile_slot[tile], first = tile_first[tile], n = tile_n[tile];
    const int nsub = F / 32, spb = Fmt<QT>::QK / 32, nxd = nsub >> xd_shift;
    const i64 row_bytes = (i64)(F / Fmt<QT>::QK) * Fmt<QT>::BB;
    const u8* dr = down + slot * slot_stride + d * row_bytes;
    i64 pr[MOE_NT];
#pragma unroll
    for (int k = 0; k < MOE_NT; ++k) pr[k] = k < n ? pair_order[first + k] : 0;
    float acc[MOE_NT];
#pragma unroll
    for (int k = 0; k < MOE_NT; ++k) acc[k] = 0.0f;
    for (int sb = lane; sb < nsub; sb += WARP_SIZE) {
        int w[8];
        float s0, s1, mn;
        Fmt<QT>::decode(dr + (i64)(sb / spb) * Fmt<QT>::BB, sb % spb, w, s0, s1, mn);
#pragma unroll
        for (int k = 0; k < MOE_NT; ++k) {
            if (k < n) {
                const i32x4* xp = (const i32x4*)(aq + pr[k] * F + sb * 32);
                const i32x4 a = xp[0], b = xp[1];
                const int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                acc[k] += ad[pr[k] * nxd + (sb >> xd_shift)] * dot32<QT>(w, s0, s1, mn, xv);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < MOE_NT; ++k) {
        if (k < n) {
            float v = warp_sum(acc[k]);
            if (bias) v += moe_down_bias(bias, pair_exp, pr[k], d, F, D);
            if (lane == 0) y[pr[k] * D + d] = v;
        }
    }
}

#define MOE_TILE_KERNELS(name, QT)                                                             \
    extern "C" __global__ void moe_gate_up_tiles_##name(                                       \
        const u8* gate, const u8* up, i64 slot_stride, const i8* hq, const float* hd,          \
        int xd_shift, const i32* tile_slot, const i32* tile_first, const i32* tile_n,          \
        const i32* pair_order, int K, float* act, int F, int D, const i32* ntiles,             \
        const float* bias, const i32* pair_exp, int act_kind) {                                \
        PDL_ENTER();                                                                           \
        if (ntiles && (int)blockIdx.y >= ntiles[0]) return; /* past the card-grouped tiles */  \
        moe_gate_up_tiles<QT>(gate, up, slot_stride, hq, hd, xd_shift, tile_slot, tile_first,  \
                              tile_n, pair_order, K, act, F, D, bias, pair_exp, act_kind);     \
    }                                                                                          \
    extern "C" __global__ void moe_down_tiles_##name(                                          \
        const u8* down, i64 slot_stride, const i8* aq, const float* ad, int xd_shift,          \
        const i32* tile_slot, const i32* tile_first, const i32* tile_n, const i32* pair_order, \
        float* y, int D, int F, const i32* ntiles, const float* bias, const i32* pair_exp) {   \
        PDL_ENTER();                                                                           \
        if (ntiles && (int)blockIdx.y >= ntiles[0]) return;                                    \
        moe_down_tiles<QT>(down, slot_stride, aq, ad, xd_shift, tile_slot, tile_first, tile_n, \
                           pair_order, y, D, F, bias, pair_exp);                               \
    }
QFORMATS(MOE_TILE_KERNELS)

extern "C" __global__ void moe_sum_pairs(const float* __restrict__ y,
                                         const i32* __restrict__ pair_slot,
                                         const float* __restrict__ pair_w, int K, int D,
                                         float* __restrict__ out) {
    PDL_ENTER();
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    const i64 t = blockIdx.y;
    if (d >= D) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
        const i64 p = t * K + k;
        if (pair_slot[p] >= 0) acc += pair_w[p] * y[p * D + d];
    }
    out[t * D + d] = acc;
}
