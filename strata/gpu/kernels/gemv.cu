// Quantized GEMV / skinny GEMM: out[t, r] = sum_i W[r, i] * x[t, i] (+ bias[r]) (+ resid[t, r]),
// out and resid rows `ldo` floats apart (a slice of a wider buffer, e.g. the fused q|k|v row).
//
// One warp per output row; each lane takes 32-element sub-blocks of the row (decoded once into
// int8, then dotted with every token's Q8 activation by dp4a), tokens in passes of GEMV_NT
// (gemv_*, prefill; decode takes gemv1w_* below). The passes are dealt over gridDim.y blocks of
// rows (gemv.py token_groups): few rows (the router's 128) still fill the card. The activation is the device-quantized x (norm_quant.cu): int8 quants xq [T, cols] and scales xd
// with one scale per 32 << xd_shift elements (Q8_0: shift 0, Q8_K: shift 3). Float weights
// (F32/F16/BF16) take the already-rounded float activation instead.
#include "quant_blocks.cuh"

#define GEMV_NT 8

template <int QT, int NT>
__device__ __forceinline__ void gemv_q(const u8* __restrict__ W, const i8* __restrict__ xq,
                                       const float* __restrict__ xd, int xd_shift,
                                       const float* __restrict__ bias,
                                       const float* __restrict__ resid, float* __restrict__ out,
                                       int rows, int cols, int ntok, int ldo) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int r = blockIdx.x * (blockDim.x / WARP_SIZE) + wid;
    if (r >= rows) return;  // the whole warp leaves together
    const int nsub = cols / 32, spb = Fmt<QT>::QK / 32, nxd = nsub >> xd_shift;
    const u8* wr = W + (i64)r * (cols / Fmt<QT>::QK) * Fmt<QT>::BB;
    // passes of NT tokens, dealt over the grid's y blocks (each (row, token) sum is one warp's,
    // in the same order whatever the split)
    for (int t0 = blockIdx.y * NT; t0 < ntok; t0 += NT * gridDim.y) {
        const int nt = min(NT, ntok - t0);
        float acc[NT];
#pragma unroll
        for (int k = 0; k < NT; ++k) acc[k] = 0.0f;
#pragma unroll 2
        for (int sb = lane; sb < nsub; sb += WARP_SIZE) {
            int w[8];
            float s0, s1, mn;
            Fmt<QT>::decode(wr + (i64)(sb / spb) * Fmt<QT>::BB, sb % spb, w, s0, s1, mn);
#pragma unroll
            for (int k = 0; k < NT; ++k) {
                if (k < nt) {
                    const i64 t = t0 + k;
                    const i32x4* xp = (const i32x4*)(xq + t * cols + sb * 32);
                    const i32x4 a = xp[0], b = xp[1];
                    const int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                    acc[k] += xd[t * nxd + (sb >> xd_shift)] * dot32<QT>(w, s0, s1, mn, xv);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < NT; ++k) {
            if (k < nt) {
                float v = warp_sum(acc[k]);
                if (lane == 0) {
                    const i64 t = t0 + k;
                    if (bias) v += bias[r];
                    if (resid) v += resid[t * ldo + r];
                    out[t * ldo + r] = v;
                }
            }
        }
    }
}

template <int QT>
__device__ __forceinline__ float ld_wf(const u8* row, int i) {
    if (QT == QT_F32) return ((const float*)row)[i];
    if (QT == QT_F16) return h2f(((const u16*)row)[i]);
    return bf2f(((const u16*)row)[i]);
}

template <int QT>
__device__ __forceinline__ void gemv_f(const u8* __restrict__ W, const float* __restrict__ x,
                                       const float* __restrict__ bias,
                                       const float* __restrict__ resid, float* __restrict__ out,
                                       int rows, int cols, int ntok, int ldo) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int r = blockIdx.x * (blockDim.x / WARP_SIZE) + wid;
    if (r >= rows) return;
    const int esz = QT == QT_F32 ? 4 : 2;
    const u8* wr = W + (i64)r * cols * esz;
    for (int t0 = blockIdx.y * GEMV_NT; t0 < ntok; t0 += GEMV_NT * gridDim.y) {
        const int nt = min(GEMV_NT, ntok - t0);
        float acc[GEMV_NT];
#pragma unroll
        for (int k = 0; k < GEMV_NT; ++k) acc[k] = 0.0f;
        for (int i = lane; i < cols; i += WARP_SIZE) {
            const float wv = ld_wf<QT>(wr, i);
#pragma unroll
            for (int k = 0; k < GEMV_NT; ++k)
                if (k < nt) acc[k] += wv * x[(i64)(t0 + k) * cols + i];
        }
#pragma unroll
        for (int k = 0; k < GEMV_NT; ++k) {
            if (k < nt) {
                float v = warp_sum(acc[k]);
                if (lane == 0) {
                    const i64 t = t0 + k;
                    if (bias) v += bias[r];
                    if (resid) v += resid[t * ldo + r];
                    out[t * ldo + r] = v;
                }
            }
        }
    }
}

#define GEMV_Q_KERNEL(name, QT)                                                                 \
    extern "C" __global__ void gemv_##name(const u8* W, const i8* xq, const float* xd,          \
                                           int xd_shift, const float* bias, const float* resid, \
                                           float* out, int rows, int cols, int ntok, int ldo) { \
        PDL_ENTER();                                                                            \
        gemv_q<QT, GEMV_NT>(W, xq, xd, xd_shift, bias, resid, out, rows, cols, ntok, ldo);      \
    }
QFORMATS(GEMV_Q_KERNEL)

#define GEMV_F_KERNEL(name, QT)                                                                 \
    extern "C" __global__ void gemv_##name(const u8* W, const float* x, const float* bias,      \
                                           const float* resid, float* out, int rows, int cols,  \
                                           int ntok, int ldo) {                                 \
        PDL_ENTER();                                                                            \
        gemv_f<QT>(W, x, bias, resid, out, rows, cols, ntok, ldo);                              \
    }
GEMV_F_KERNEL(f32, QT_F32)
GEMV_F_KERNEL(f16, QT_F16)
GEMV_F_KERNEL(bf16, QT_BF16)

#define GEMV1_MAX_WARPS 16  // gemv1w_*: its warps a block come from blockDim
// The formats (bit QT) whose gemv1w_* stages its code table in shared memory (GridTab: lane-banked
// copies, as many as GRID_SMEM_BYTES hold), after the row's L2 prefetch and before the PDL wait.
// Through L1 a warp's 32 random words of IQ1_M's 8 KiB of codes are about 25 line reads; one
// shared copy, with 16 warps a block (gemv.py GEMV1_WARPS_BY_TYPE), took its GEMVs 0.54-0.81x
// the time on the H100, IQ2_S's 4 KiB 0.54-0.76x. The small grids (IQ3_XXS, IQ3_S, IQ2_XXS) stay
// in global memory: the copy and barrier of each block cost 5-10% at the attention shapes.
#define GEMV1_SMEM_FMTS ((1ull << 29) | (1ull << 22))
#define GEMV1_TAB_ON(QT) ((GEMV1_SMEM_FMTS >> (QT)) & 1ull)

// the table gemv1w_* decodes from: shared copies (stage_tab: every thread, a barrier) where
// GEMV1_TAB_ON(QT) and GridTab finds room, else the global table
template <int QT, bool ON = GEMV1_TAB_ON(QT)>
struct Gemv1Tab {
    typedef GridTab<QT, GRID_SMEM_BYTES> GT;
    typedef typename GT::Store Store;
    static __device__ __forceinline__ typename GT::Ref get(Store& s) {
        return stage_tab<QT, GRID_SMEM_BYTES>(s.v);
    }
};
template <int QT>
struct Gemv1Tab<QT, false> {
    struct Store {
        u32 unused;
    };
    static __device__ __forceinline__ GridRef<typename Fmt<QT>::tab_t, 1> get(Store&) {
        return GridRef<typename Fmt<QT>::tab_t, 1>{Fmt<QT>::gtab()};
    }
};
// The formats (bit QT) whose gemv1w_* loop advances its block and activation pointers by
// constants instead of computing them from the sub-block index (same loads, same integers):
// IQ3_XXS / IQ2_XXS attention GEMVs 0.95-0.98x the time; Q6_K and IQ1_M were slower.
#define GEMV1_STEP ((1ull << 16) | (1ull << 18))
#define GEMV1_STEP_ON(QT) ((GEMV1_STEP >> (QT)) & 1ull)

// ---- decode (T = 1), rows split over warps: gemv1w_* ----
// gemv_*'s loads and arithmetic for one token, with `wpr` warps of a block sharing a row
// (sub-blocks dealt round-robin across the row's warps, so neighbouring warps read neighbouring
// bytes). The row's warp sums are added in a fixed order. Warps a block: blockDim
// (gemv.py GEMV1_WARPS, GEMV1_WARPS_BY_TYPE). PDL in the split form (common.cuh): the row asked of L2 before the
// wait, the next kernel let in at once (`early`) or after the main loop.
template <int QT>
__device__ __forceinline__ void gemv1_split(const u8* __restrict__ W, const i8* __restrict__ xq,
                                            const float* __restrict__ xd, int xd_shift,
                                            const float* __restrict__ bias,
                                            const float* __restrict__ resid,
                                            float* __restrict__ out, int rows, int cols, int wpr,
                                            int early) {
    __shared__ float part[GEMV1_MAX_WARPS];
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int nw = blockDim.x / WARP_SIZE;  // gemv.py GEMV1_WARPS (at most GEMV1_MAX_WARPS)
    const int r = blockIdx.x * (nw / wpr) + wid / wpr, ws = wid % wpr;
    const int nsub = cols / 32, spb = Fmt<QT>::QK / 32;
    const int row_bytes = (cols / Fmt<QT>::QK) * Fmt<QT>::BB;
    const u8* wr = W + (i64)min(r, rows - 1) * row_bytes;
    __shared__ typename Gemv1Tab<QT>::Store smt;
    // the weights do not depend on the kernel before: ask L2 for this warp's share of the row
    // (128-byte lines) while that kernel finishes, then wait for it (common.cuh)
    if (r < rows)
        for (int off = (ws * WARP_SIZE + lane) * 128; off < row_bytes;
             off += WARP_SIZE * wpr * 128)
            PREFETCH_L2(wr + off);
    const auto tab = Gemv1Tab<QT>::get(smt);  // every thread, before any return
    PDL_WAIT();
    if (early) PDL_TRIGGER();
    float acc = 0.0f;
    if (r < rows) {
        // GEMV1_STEP: the step (a multiple of spb: warps are 32 or 64 lanes) keeps sb % spb,
        // so the block and activation pointers advance by constants; else both from sb
        const int sb0 = ws * WARP_SIZE + lane, step = WARP_SIZE * wpr, j0 = sb0 % spb;
        const u8* bp = wr + (i64)(sb0 / spb) * Fmt<QT>::BB;
        const i64 bstep = (i64)(step / spb) * Fmt<QT>::BB;
        const i32x4* xp = (const i32x4*)(xq + (i64)sb0 * 32);
#pragma unroll 2
        for (int sb = sb0; sb < nsub; sb += step, bp += bstep, xp += 2 * step) {
            int w[8];
            float s0, s1, mn;
            if (GEMV1_STEP_ON(QT))
                Fmt<QT>::decode(bp, j0, w, s0, s1, mn, tab);
            else
                Fmt<QT>::decode(wr + (i64)(sb / spb) * Fmt<QT>::BB, sb % spb, w, s0, s1, mn, tab);
            const i32x4* xs = GEMV1_STEP_ON(QT) ? xp : (const i32x4*)(xq + (i64)sb * 32);
            const i32x4 a = xs[0], b = xs[1];
            const int xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            acc += xd[sb >> xd_shift] * dot32<QT>(w, s0, s1, mn, xv);
        }
    }
    if (!early) PDL_TRIGGER();
    acc = warp_sum(acc);
    if (wpr > 1) {
        if (lane == 0) part[wid] = acc;
        __syncthreads();
        if (ws != 0) return;
        for (int k = 1; k < wpr; ++k) acc += part[wid + k];
    }
    if (lane == 0 && r < rows) {
        if (bias) acc += bias[r];
        if (resid) acc += resid[r];
        out[r] = acc;
    }
}

#define GEMV1W_KERNEL(name, QT)                                                                 \
    extern "C" __global__ void                                                                  \
        gemv1w_##name(const u8* W, const i8* xq, const float* xd, int xd_shift,                 \
                      const float* bias, const float* resid, float* out, int rows, int cols,    \
                      int wpr, int early) {                                                     \
        gemv1_split<QT>(W, xq, xd, xd_shift, bias, resid, out, rows, cols, wpr, early);         \
    }
QFORMATS(GEMV1W_KERNEL)

// ---- decode (T = 1), float weights: gemv1f_* ----
// One block of GEMV1F_THREADS per row (the router's 128 rows fill 128 SMs, where one warp per
// row left 96 idle): each thread takes 16-byte chunks of the row (4 floats or 8 halves) and the
// matching x, GEMV1F_U chunks' loads issued before their sums; warp sums, then the block's in
// warp order (deterministic). cols must be a multiple of 8 (the launcher checks).
#define GEMV1F_THREADS 128
#define GEMV1F_U 4
template <int QT>
__device__ __forceinline__ void wf8(const u8* row, int c, float (&w)[8]) {  // chunk c: 8 floats
    if (QT == QT_F32) {
        const f32x4 a = ((const f32x4*)row)[2 * c], b = ((const f32x4*)row)[2 * c + 1];
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z,
        w[7] = b.w;
    } else {
        const i32x4 a = ((const i32x4*)row)[c];
        const int u[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u16 lo = (u16)(u[j] & 0xffff), hi = (u16)((u32)u[j] >> 16);
            w[2 * j] = QT == QT_F16 ? h2f(lo) : bf2f(lo);
            w[2 * j + 1] = QT == QT_F16 ? h2f(hi) : bf2f(hi);
        }
    }
}

template <int QT>
__device__ __forceinline__ void gemv1_f(const u8* __restrict__ W, const float* __restrict__ x,
                                        const float* __restrict__ bias,
                                        const float* __restrict__ resid, float* __restrict__ out,
                                        int cols) {
    __shared__ float part[GEMV1F_THREADS / 32];
    const int r = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const int lane = tid % WARP_SIZE, wid = tid / WARP_SIZE, nw = nt / WARP_SIZE;
    const u8* wr = W + (i64)r * cols * (QT == QT_F32 ? 4 : 2);
    const int nch = cols / 8;
    for (int off = tid * 128; off < cols * (QT == QT_F32 ? 4 : 2); off += nt * 128)
        PREFETCH_L2(wr + off);  // the row ahead of the wait (gemv1_split)
    PDL_WAIT();
    PDL_TRIGGER();  // few blocks (the router's 128): the next kernel's fit beside them
    float acc = 0.0f;
    for (int c0 = tid; c0 < nch; c0 += GEMV1F_U * nt) {
        float w[GEMV1F_U][8], xv[GEMV1F_U][8];
#pragma unroll
        for (int u = 0; u < GEMV1F_U; ++u) {
            const int c = c0 + u * nt;
            if (c < nch) {
                wf8<QT>(wr, c, w[u]);
                wf8<QT_F32>((const u8*)x, c, xv[u]);
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) w[u][j] = xv[u][j] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < GEMV1F_U; ++u)
#pragma unroll
            for (int j = 0; j < 8; ++j) acc += w[u][j] * xv[u][j];
    }
    acc = warp_sum(acc);
    if (lane == 0) part[wid] = acc;
    __syncthreads();
    if (tid == 0) {
        float v = part[0];
        for (int k = 1; k < nw; ++k) v += part[k];
        if (bias) v += bias[r];
        if (resid) v += resid[r];
        out[r] = v;
    }
}

#define GEMV1F_KERNEL(name, QT)                                                                 \
    extern "C" __global__ void __launch_bounds__(GEMV1F_THREADS)                                \
        gemv1f_##name(const u8* W, const float* x, const float* bias, const float* resid,       \
                      float* out, int cols) {                                                   \
        gemv1_f<QT>(W, x, bias, resid, out, cols);                                              \
    }
GEMV1F_KERNEL(f32, QT_F32)
GEMV1F_KERNEL(f16, QT_F16)
GEMV1F_KERNEL(bf16, QT_BF16)
