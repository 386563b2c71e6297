// Resident experts of one layer, for the whole (token, slot, weight) list in two GEMV-shaped
// launches plus the Q8 quantization of the intermediate between them (norm_quant.cu):
//   moe_gate_up  grid (F / warps, P): pair p = t*K + k runs expert slot pair_slot[p] on token t
//                (= p / K): gate and up rows share the token's Q8 activation and one warp;
//                act[p, f] = silu(gate) * up, as HostTier: g / (1 + exp(-g)) * u.
//   moe_down     grid (D / warps, T): out[t, d] = sum_k w[t, k] * down_slot(act_q[t*K + k])[d],
//                the K pairs of a token summed by one warp in a fixed order (deterministic, no
//                atomics).
// Slots are fixed VRAM buffers: slot s of a matrix starts at base + s * slot_stride bytes and
// holds that expert's rows in GGUF order. pair_slot[p] < 0 skips the pair (a missed expert the
// CPU pool computes, or an empty entry).
#include "quant_blocks.cuh"

template <int QT>
__device__ __forceinline__ void moe_gate_up(const u8* __restrict__ gate, const u8* __restrict__ up,
                                            i64 slot_stride, const i8* __restrict__ hq,
                                            const float* __restrict__ hd, int xd_shift,
                                            const i32* __restrict__ pair_slot, int K,
                                            float* __restrict__ act, int F, int D) {
    const int lane = threadIdx.x % STRATA_WARP, wid = threadIdx.x / STRATA_WARP;
    const int f = blockIdx.x * (blockDim.x / STRATA_WARP) + wid;
    const int p = blockIdx.y;
    if (f >= F) return;
    const int slot = pair_slot[p];
    if (slot < 0) return;
    const i64 t = p / K;
    const int nsub = D / 32, spb = Fmt<QT>::QK / 32, nxd = nsub >> xd_shift;
    const i64 row_bytes = (i64)(D / Fmt<QT>::QK) * Fmt<QT>::BB;
    const u8* gr = gate + slot * slot_stride + f * row_bytes;
    const u8* ur = up + slot * slot_stride + f * row_bytes;
    float ag = 0.0f, au = 0.0f;
    for (int sb = lane; sb < nsub; sb += STRATA_WARP) {
        const i32x4* xp = (const i32x4*)(hq + t * D + sb * 32);
        const i32x4 a = xp[0], b = xp[1];
        const int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const float dx = hd[t * nxd + (sb >> xd_shift)];
        int w[8];
        float s0, s1, mn;
        const i64 boff = (i64)(sb / spb) * Fmt<QT>::BB;
        Fmt<QT>::decode(gr + boff, sb % spb, w, s0, s1, mn);
        ag += dx * dot32<QT>(w, s0, s1, mn, xv);
        Fmt<QT>::decode(ur + boff, sb % spb, w, s0, s1, mn);
        au += dx * dot32<QT>(w, s0, s1, mn, xv);
    }
    ag = warp_sum(ag);
    au = warp_sum(au);
    if (lane == 0) act[(i64)p * F + f] = ag / (1.0f + expf(-ag)) * au;
}

template <int QT>
__device__ __forceinline__ void moe_down(const u8* __restrict__ down, i64 slot_stride,
                                         const i8* __restrict__ aq, const float* __restrict__ ad,
                                         int xd_shift, const i32* __restrict__ pair_slot,
                                         const float* __restrict__ pair_w, int K,
                                         float* __restrict__ out, int D, int F) {
    const int lane = threadIdx.x % STRATA_WARP, wid = threadIdx.x / STRATA_WARP;
    const int d = blockIdx.x * (blockDim.x / STRATA_WARP) + wid;
    const i64 t = blockIdx.y;
    if (d >= D) return;
    const int nsub = F / 32, spb = Fmt<QT>::QK / 32, nxd = nsub >> xd_shift;
    const i64 row_bytes = (i64)(F / Fmt<QT>::QK) * Fmt<QT>::BB;
    // the lanes share out the (pair, sub-block) items of all K pairs: every pair's weights are
    // in flight at once (F = 768 is only 24 sub-blocks: one pair alone would idle the warp)
    float acc = 0.0f;
#pragma unroll 2
    for (int j = lane; j < K * nsub; j += STRATA_WARP) {
        const int k = j / nsub, sb = j - k * nsub;
        const i64 p = t * K + k;
        const int slot = pair_slot[p];
        if (slot < 0) continue;
        const u8* dr = down + slot * slot_stride + d * row_bytes;
        const i32x4* xp = (const i32x4*)(aq + p * F + sb * 32);
        const i32x4 a = xp[0], b = xp[1];
        const int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        int w[8];
        float s0, s1, mn;
        Fmt<QT>::decode(dr + (i64)(sb / spb) * Fmt<QT>::BB, sb % spb, w, s0, s1, mn);
        acc += pair_w[p] * (ad[p * nxd + (sb >> xd_shift)] * dot32<QT>(w, s0, s1, mn, xv));
    }
    acc = warp_sum(acc);
    if (lane == 0) out[t * D + d] = acc;
}

#define MOE_KERNELS(name, QT)                                                                  \
    extern "C" __global__ void moe_gate_up_##name(                                             \
        const u8* gate, const u8* up, i64 slot_stride, const i8* hq, const float* hd,          \
        int xd_shift, const i32* pair_slot, int K, float* act, int F, int D) {                 \
        moe_gate_up<QT>(gate, up, slot_stride, hq, hd, xd_shift, pair_slot, K, act, F, D);     \
    }                                                                                          \
    extern "C" __global__ void moe_down_##name(const u8* down, i64 slot_stride, const i8* aq,  \
                                               const float* ad, int xd_shift,                  \
                                               const i32* pair_slot, const float* pair_w,      \
                                               int K, float* out, int D, int F) {              \
        moe_down<QT>(down, slot_stride, aq, ad, xd_shift, pair_slot, pair_w, K, out, D, F);    \
    }
STRATA_QFORMATS(MOE_KERNELS)

// The (slot, weight) pair list of a layer from the device router's top-K, for a decode step that
// never leaves the card: pair_slot[p] = slot_row[ids[p]] (a layer's (expert -> slot) table, -1
// where the expert is not resident), pair_w[p] = weights[p].
extern "C" __global__ void moe_pairs_from_topk(const i32* __restrict__ ids,
                                               const float* __restrict__ weights,
                                               const i32* __restrict__ slot_row, int n,
                                               i32* __restrict__ pair_slot,
                                               float* __restrict__ pair_w) {
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n) return;
    pair_slot[p] = slot_row[ids[p]];
    pair_w[p] = weights[p];
}
