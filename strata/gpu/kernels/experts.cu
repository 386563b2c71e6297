// Resident experts of one layer, for the whole (token, slot, weight) list in two GEMV-shaped
// launches plus the Q8 quantization of the intermediate between them (norm_quant.cu):
//   moe_gate_up  grid (F / warps, P): pair p = t*K + k runs expert slot pair_slot[p] on token t
//                (= p / K): gate and up rows share the token's Q8 activation and one warp;
//                act[p, f] = silu(gate) * up, as HostTier: g / (1 + exp(-g)) * u.
//   moe_down     grid (D / warps, T): out[t, d] = sum_k w[t, k] * down_slot(act_q[t*K + k])[d],
//                the K pairs of a token summed by one warp in a fixed order (deterministic, no
//                atomics); with resid (optional) out[t, d] = resid[t, d] + that sum (the layer's
//                residual add, where nothing else joins the MoE sum).
// Slots are fixed VRAM buffers: slot s of a matrix starts at base + s * slot_stride bytes and
// holds that expert's rows in GGUF order. pair_slot[p] < 0 skips the pair (a missed expert the
// CPU pool computes, or an empty entry).
// Decode variants (experts.py picks one by the experts' type):
//   moe_gate_up_st1  the same sums with MOE_ST_WARPS warps a block, one row (gate and up) a
//                warp: a warp copies its rows' chunks of WARP_SIZE sub-blocks into shared memory
//                with 16-byte loads (quant_blocks.cuh staged_rows, the next chunk in flight while
//                one is decoded) and decodes from there.
//   moe_down_sp2 moe_down with two warps a row (below).
// Per (pair, row) the float operations and their order are those of moe_gate_up / moe_down.
// gpt-oss (moe_glu.cuh): the gate/up kernels take the layer's expert biases, the pairs' experts
// and the activation (bias, pair_exp, act), the down kernels the biases and pairs' experts, a
// pair's down bias joining its first sub-block's item (null bias: none, the same bits as before).
#include "moe_glu.cuh"
#include "quant_blocks.cuh"

#define MOE_ST_WARPS 4  // experts.py's ST_WARPS

// one warp: the (gate[f], up[f]) sums of expert slot `slot` on token t (lane 0 holds them)
template <int QT, class G>
__device__ __forceinline__ float2 moe_gate_up_row(const u8* __restrict__ gate,
                                                  const u8* __restrict__ up, int slot,
                                                  i64 slot_stride, const i8* __restrict__ hq,
                                                  const float* __restrict__ hd, int xd_shift,
                                                  i64 t, int f, int D, int lane,
                                                  const G tab) {
    const int nsub = D / 32, spb = Fmt<QT>::QK / 32, nxd = nsub >> xd_shift;
    const i64 row_bytes = (i64)(D / Fmt<QT>::QK) * Fmt<QT>::BB;
    const u8* gr = gate + slot * slot_stride + f * row_bytes;
    const u8* ur = up + slot * slot_stride + f * row_bytes;
    float ag = 0.0f, au = 0.0f;
#pragma unroll 2  // D = 2048: both of a lane's sub-blocks in flight at once
    for (int sb = lane; sb < nsub; sb += WARP_SIZE) {
        const i32x4* xp = (const i32x4*)(hq + t * D + sb * 32);
        const i32x4 a = xp[0], b = xp[1];
        const int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const float dx = hd[t * nxd + (sb >> xd_shift)];
        int w[8];
        float s0, s1, mn;
        const i64 boff = (i64)(sb / spb) * Fmt<QT>::BB;
        Fmt<QT>::decode(gr + boff, sb % spb, w, s0, s1, mn, tab);
        ag += dx * dot32<QT>(w, s0, s1, mn, xv);
        Fmt<QT>::decode(ur + boff, sb % spb, w, s0, s1, mn, tab);
        au += dx * dot32<QT>(w, s0, s1, mn, xv);
    }
    return make_float2(warp_sum(ag), warp_sum(au));
}

template <int QT>
__device__ __forceinline__ void moe_gate_up(const u8* __restrict__ gate, const u8* __restrict__ up,
                                            i64 slot_stride, const i8* __restrict__ hq,
                                            const float* __restrict__ hd, int xd_shift,
                                            const i32* __restrict__ pair_slot, int K,
                                            float* __restrict__ act, int F, int D,
                                            const float* __restrict__ bias,
                                            const i32* __restrict__ pair_exp, int act_kind) {
    __shared__ typename GridTab<QT>::Store smt;
    const auto tab = stage_tab<QT>(smt.v);  // every thread, before any return
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int f = blockIdx.x * (blockDim.x / WARP_SIZE) + wid;
    const int p = blockIdx.y;
    if (f >= F) return;
    const int slot = pair_slot[p];
    if (slot < 0) return;
    const float2 gu = moe_gate_up_row<QT>(gate, up, slot, slot_stride, hq, hd, xd_shift, p / K,
                                          f, D, lane, tab);
    if (lane == 0) act[(i64)p * F + f] = moe_glu(gu.x, gu.y, bias, pair_exp, p, f, F, D, act_kind);
}

template <int QT>
__device__ __forceinline__ void moe_down(const u8* __restrict__ down, i64 slot_stride,
                                         const i8* __restrict__ aq, const float* __restrict__ ad,
                                         int xd_shift, const i32* __restrict__ pair_slot,
                                         const float* __restrict__ pair_w, int K,
                                         float* __restrict__ out, int D, int F,
                                         const float* __restrict__ resid,
                                         const float* __restrict__ bias,
                                         const i32* __restrict__ pair_exp) {
    __shared__ typename GridTab<QT>::Store smt;
    const auto tab = stage_tab<QT>(smt.v);  // every thread, before any return
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int d = blockIdx.x * (blockDim.x / WARP_SIZE) + wid;
    const i64 t = blockIdx.y;
    if (d >= D) return;
    const int nsub = F / 32, spb = Fmt<QT>::QK / 32, nxd = nsub >> xd_shift;
    const i64 row_bytes = (i64)(F / Fmt<QT>::QK) * Fmt<QT>::BB;
    // the lanes share out the (pair, sub-block) items of all K pairs: every pair's weights are
    // in flight at once (F = 768 is only 24 sub-blocks: one pair alone would idle the warp)
    float acc = 0.0f;
#pragma unroll 6  // K = 8, F = 768: a lane's 6 items in flight at once
    for (int j = lane; j < K * nsub; j += WARP_SIZE) {
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
        Fmt<QT>::decode(dr + (i64)(sb / spb) * Fmt<QT>::BB, sb % spb, w, s0, s1, mn, tab);
        float q = ad[p * nxd + (sb >> xd_shift)] * dot32<QT>(w, s0, s1, mn, xv);
        if (bias && sb == 0) q += moe_down_bias(bias, pair_exp, p, d, F, D);
        acc += pair_w[p] * q;
    }
    acc = warp_sum(acc);
    if (lane == 0) out[t * D + d] = resid ? resid[t * D + d] + acc : acc;
}

template <int QT, int R>
__device__ __forceinline__ void moe_gate_up_st(const u8* __restrict__ gate,
                                               const u8* __restrict__ up, i64 slot_stride,
                                               const i8* __restrict__ hq,
                                               const float* __restrict__ hd, int xd_shift,
                                               const i32* __restrict__ pair_slot, int K,
                                               float* __restrict__ act, int F, int D,
                                               const float* __restrict__ bias,
                                               const i32* __restrict__ pair_exp, int act_kind) {
    typedef Stage<QT> S;
    __shared__ i32x4 sm[MOE_ST_WARPS][2 * R * S::BUF / 16];  // 16-byte aligned
    __shared__ typename GridTab<QT>::Store smt;
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int p = blockIdx.y;
    const int slot = pair_slot[p];
    if (slot < 0) return;  // the whole block: one pair
    const auto tab = stage_tab<QT>(smt.v);
    const int f0 = (blockIdx.x * MOE_ST_WARPS + wid) * R;
    if (f0 >= F) return;
    const i64 t = p / K;
    const int nsub = D / 32, nxd = nsub >> xd_shift;
    const i64 row_bytes = (i64)(D / Fmt<QT>::QK) * Fmt<QT>::BB;
    const u8* rows[2 * R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const i64 off = slot * slot_stride + (i64)min(f0 + r, F - 1) * row_bytes;
        rows[2 * r] = gate + off;
        rows[2 * r + 1] = up + off;
    }
    float acc[2 * R];
#pragma unroll
    for (int m = 0; m < 2 * R; ++m) acc[m] = 0.0f;
    staged_rows<QT, 2 * R>((u8*)sm[wid], rows, nsub, 0, 1, hq + t * D, hd + t * nxd, xd_shift, tab,
                           acc);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const float ag = warp_sum(acc[2 * r]), au = warp_sum(acc[2 * r + 1]);
        if (lane == 0 && f0 + r < F)
            act[(i64)p * F + f0 + r] = moe_glu(ag, au, bias, pair_exp, p, f0 + r, F, D, act_kind);
    }
}

// moe_down with W warps a row: the lanes' item iterations (item j = lane + WARP_SIZE * i, as
// moe_down deals them) cut into W runs, warp w computing run w. Warp 0 sums its own run as
// moe_down does; the others leave each item's two factors (pair weight, scaled dot) in shared
// memory, and warp 0 then adds them in moe_down's order with moe_down's expression: the same
// float operations in the same order, so the same bits, with W times the warps in flight (moe_down
// runs D * T warps: a quarter of an H200's warp slots at D = 2048, T = 1). Rows a block: MOE_SP_R
// (W), one row's iterations at most MOE_SP_IT (experts.py uses moe_down past that).
#define MOE_SP_IT 16
#define MOE_SP_R(W) ((W) >= 4 ? 1 : 4 / (W))

template <int QT, int W>
__device__ __forceinline__ void moe_down_sp(const u8* __restrict__ down, i64 slot_stride,
                                            const i8* __restrict__ aq,
                                            const float* __restrict__ ad, int xd_shift,
                                            const i32* __restrict__ pair_slot,
                                            const float* __restrict__ pair_w, int K,
                                            float* __restrict__ out, int D, int F,
                                            const float* __restrict__ resid,
                                            const float* __restrict__ bias,
                                            const i32* __restrict__ pair_exp) {
    enum { R = MOE_SP_R(W) };
    __shared__ typename GridTab<QT>::Store smt;
    __shared__ float2 part[R][MOE_SP_IT][WARP_SIZE];  // (pair weight, scaled dot) of an item
    const auto tab = stage_tab<QT>(smt.v);  // every thread, before any return
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int r = wid / W, w = wid % W;
    const int d = blockIdx.x * R + r;
    const i64 t = blockIdx.y;
    const int nsub = F / 32, spb = Fmt<QT>::QK / 32, nxd = nsub >> xd_shift;
    const int nj = K * nsub, nit = (nj + WARP_SIZE - 1) / WARP_SIZE;
    const int i0 = nit * w / W, i1 = nit * (w + 1) / W;
    const i64 row_bytes = (i64)(F / Fmt<QT>::QK) * Fmt<QT>::BB;
    float acc = 0.0f;
    if (d < D) {
#pragma unroll 3
        for (int i = i0; i < i1; ++i) {
            const int j = lane + WARP_SIZE * i;
            if (j >= nj) break;
            const int k = j / nsub, sb = j - k * nsub;
            const i64 p = t * K + k;
            const int slot = pair_slot[p];
            if (slot < 0) continue;
            const u8* dr = down + slot * slot_stride + d * row_bytes;
            const i32x4* xp = (const i32x4*)(aq + p * F + sb * 32);
            const i32x4 a = xp[0], b = xp[1];
            const int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            int wq[8];
            float s0, s1, mn;
            Fmt<QT>::decode(dr + (i64)(sb / spb) * Fmt<QT>::BB, sb % spb, wq, s0, s1, mn, tab);
            const float pw = pair_w[p];
            float q = ad[p * nxd + (sb >> xd_shift)] * dot32<QT>(wq, s0, s1, mn, xv);
            if (bias && sb == 0) q += moe_down_bias(bias, pair_exp, p, d, F, D);
            if (w == 0)
                acc += pw * q;  // moe_down's expression
            else
                part[r][i][lane] = make_float2(pw, q);
        }
    }
    __syncthreads();
    if (w != 0 || d >= D) return;
    for (int i = i1; i < nit; ++i) {  // the other warps' items, in moe_down's order
        const int j = lane + WARP_SIZE * i;
        if (j >= nj) break;
        if (pair_slot[t * K + j / nsub] < 0) continue;
        const float2 v = part[r][i][lane];
        acc += v.x * v.y;
    }
    acc = warp_sum(acc);
    if (lane == 0) out[t * D + d] = resid ? resid[t * D + d] + acc : acc;
}

#define MOE_SP_KERNEL(name, QT, W)                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_SP_R(W) * W * WARP_SIZE)                  \
        moe_down_sp##W##_##name(const u8* down, i64 slot_stride, const i8* aq, const float* ad, \
                                int xd_shift, const i32* pair_slot, const float* pair_w, int K, \
                                float* out, int D, int F, const float* resid, const float* bias, \
                                const i32* pair_exp) {                                         \
        PDL_ENTER();                                                                           \
        moe_down_sp<QT, W>(down, slot_stride, aq, ad, xd_shift, pair_slot, pair_w, K, out,     \
                               D, F, resid, bias, pair_exp);                                   \
    }
#define MOE_SP_KERNELS(name, QT) \
    MOE_SP_KERNEL(name, QT, 2)
QFORMATS(MOE_SP_KERNELS)

#define MOE_KERNELS(name, QT)                                                                  \
    extern "C" __global__ void moe_gate_up_##name(                                             \
        const u8* gate, const u8* up, i64 slot_stride, const i8* hq, const float* hd,          \
        int xd_shift, const i32* pair_slot, int K, float* act, int F, int D, const float* bias, \
        const i32* pair_exp, int act_kind) {                                                   \
        PDL_ENTER();                                                                           \
        moe_gate_up<QT>(gate, up, slot_stride, hq, hd, xd_shift, pair_slot, K, act, F, D, bias, \
                        pair_exp, act_kind);                                                   \
    }                                                                                          \
    extern "C" __global__ void moe_down_##name(const u8* down, i64 slot_stride, const i8* aq,  \
                                               const float* ad, int xd_shift,                  \
                                               const i32* pair_slot, const float* pair_w,      \
                                               int K, float* out, int D, int F,                \
                                               const float* resid, const float* bias,          \
                                               const i32* pair_exp) {                          \
        PDL_ENTER();                                                                           \
        moe_down<QT>(down, slot_stride, aq, ad, xd_shift, pair_slot, pair_w, K, out, D, F,     \
                         resid, bias, pair_exp);                                               \
    }
QFORMATS(MOE_KERNELS)

#define MOE_ST_KERNELS(name, QT)                                                               \
    extern "C" __global__ void __launch_bounds__(MOE_ST_WARPS* WARP_SIZE)                      \
        moe_gate_up_st1_##name(const u8* gate, const u8* up, i64 slot_stride, const i8* hq,    \
                               const float* hd, int xd_shift, const i32* pair_slot, int K,     \
                               float* act, int F, int D, const float* bias, const i32* pair_exp, \
                               int act_kind) {                                                 \
        PDL_ENTER();                                                                           \
        moe_gate_up_st<QT, 1>(gate, up, slot_stride, hq, hd, xd_shift, pair_slot, K, act,      \
                                  F, D, bias, pair_exp, act_kind);                             \
    }
QFORMATS(MOE_ST_KERNELS)
