// Resident experts for many tokens (prefill) on the int8 tensor cores: the tile kernels of
// experts_grouped.cu (same arguments, same tiles of pairs sharing an expert slot) with each
// sub-block's integer sums from mma.sync m16n8k16 s8 instead of dp4a, for CUDA sm_80+ (elsewhere
// the kernels are empty and the launcher keeps the dp4a ones).
//   A warp owns 16 weight rows; its lanes decode one sub-block each (Fmt<QT>::decode: 32 int8
//   and the scales) into shared memory, then the mma multiplies the 16 rows by 8 activation rows
//   at a time (up to MMA_NT per tile): the 16 low and the 16 high values of a sub-block are two
//   k16 products, so each comes out as an exact int32 and takes its own scale (s0, s1), then
//   - mn * sum(x) where the format has a min, then the activation's scale: dot32's float steps
//   per sub-block, summed over the sub-blocks in order (one thread a sum; not dot32's lane-strided
//   order, so float noise apart from the dp4a kernels).
//   moe_gate_up_mma grid (F / (16 MMA_WARPS), tiles): act[p, f] = silu(gate) * up (lanes 0-15
//                   decode gate rows, 16-31 up rows of the same sub-block).
//   moe_down_mma    grid (D / (16 MMA_WARPS), tiles): y[p, d] = down_slot(act_q[p])[d] (lanes
//                   0-15 decode sub-block sb, 16-31 sub-block sb + 1); (+ bias[d]) (+ resid[p, d]),
//                   rows ldo apart.
//   ntiles          (optional, the two MoE kernels' last argument) as in experts_grouped.cu.
//   dense_mma       moe_down_mma with tiles of MMA_DENSE_NT rows of x: with one slot (stride 0)
//                   and tiles of consecutive tokens, a prompt chunk's dense GEMM (gemv.py
//                   gemm_mma: the attention projections, lm_head, the shared expert).
// Fragments (PTX ISA, mma.m16n8k16 .s8): lane = 4 g + t; A regs: row g / g + 8, k 4t..4t+3;
// B reg: k 4t..4t+3 of column g; C: rows g / g + 8, columns 2t, 2t + 1.
#include "quant_blocks.cuh"

#define MMA_NT 32        // pairs per tile: four mma column blocks of 8
#define MMA_DENSE_NT 64  // dense_mma: tokens per tile (a decoded sub-block meets 64 rows of x)
#define MMA_WARPS 4      // warps per block, 16 weight rows each
#define MMA_WSTRIDE 12   // ints per decoded row in shared memory (8 used; 48 B: conflict-free)

#if !defined(__HIP__) && !defined(GPU_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define HAS_MMA_S8 1
#else
#define HAS_MMA_S8 0
#endif
// A block stages its tile's rows of x (and their scales) in shared memory, KC sub-blocks at a
// time, by 16-byte loads shared by its warps; each lane then reads its B fragments (lo and hi
// half of a sub-block) as one 8-byte load, conflict-free.
#define MMA_KC 8  // sub-blocks of x staged at a time (256 values; 128 for QK = 32 with WSTAGE)
// The formats (bit QT) whose dense_mma warps also stage their weight rows' bytes of the chunk
// in shared memory, by 16-byte loads along the rows, and decode from there; elsewhere (and in
// every MoE tile) each lane decodes straight from global memory. The tiles are L1-bound: staging
// took 0-20% off the dense GEMM of these four, but cost IQ3_XXS 14-20% (its few bytes a chunk
// leave the staging's load latency exposed) and IQ3_XXS's MoE gate/up 1.7x.
#define MMA_WSTAGE_DENSE ((1ull << 8) | (1ull << 12) | (1ull << 14) | (1ull << 29))
#define MMA_WS_DENSE(QT) ((MMA_WSTAGE_DENSE >> (QT)) & 1ull)

#if HAS_MMA_S8
__device__ __forceinline__ void mma_s8_k16(int* c, int a0, int a1, int b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

struct alignas(16) MmaStage {  // one warp's decoded sub-blocks: [2][16 rows]
    int w[2][16][MMA_WSTRIDE];
    float s[2][16][4];  // s0, s1, mn
};

// GATE_UP: rows of x are tokens (pair / K), two matrices (wa gate, wb up) -> silu(g) * u;
// else rows of x are pairs (K = 1), one matrix (wa down). NB: mma column blocks of 8 a tile (a
// tile holds up to 8 NB rows of x; each decoded sub-block meets them all).
template <int QT, bool GATE_UP, int NB, bool WS>
__device__ __forceinline__ void moe_tiles_mma(
    const u8* __restrict__ wa, const u8* __restrict__ wb, i64 slot_stride,
    const i8* __restrict__ xq, const float* __restrict__ xd, int xd_shift,
    const i32* __restrict__ tile_slot, const i32* __restrict__ tile_first,
    const i32* __restrict__ tile_n, const i32* __restrict__ pair_order, int K,
    float* __restrict__ out, int R, int C, const float* __restrict__ bias,
    const float* __restrict__ resid, int ldo) {
    enum {
        WSTAGE = WS,
        KC = WSTAGE && Fmt<QT>::QK == 32 ? MMA_KC / 2 : MMA_KC,  // sub-blocks a chunk
        XS = KC * 8 + 8,  // ints per staged x row: 8 mod 32 (LDS.64 conflict-free)
        NR = GATE_UP ? 32 : 16,                      // weight rows a warp decodes
        CHB = KC * 32 / Fmt<QT>::QK * Fmt<QT>::BB,   // bytes of a row's chunk
        WB = WSTAGE ? (CHB + 30) / 16 * 16 : 16      // its 16-byte span (+ the row's offset)
    };
    __shared__ MmaStage stage[MMA_WARPS];
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const int g = lane >> 2, t4 = lane & 3;
    const int r0 = (blockIdx.x * MMA_WARPS + wid) * 16;
    // x's rows of this tile, KC sub-blocks of them at a time: a sub-block's eight ints
    // interleaved lo/hi (int 2i = its int i, 2i + 1 = its int 4 + i), so that lane (g, t4)
    // reads its pair (t4, 4 + t4) as one 8-byte load; rows past the tile's n are zeros
    __shared__ alignas(16) int xs[NB * 8][XS];
    __shared__ float xds[NB * 8][KC];
    // a warp's weight rows, the chunk's bytes of each: rows 0-15 its rows of wa, 16-31 (gate/up)
    // the same rows of wb
    __shared__ alignas(16) u8 wst[MMA_WARPS][WSTAGE ? NR * WB : 16];
    const bool live = r0 < R;  // a warp past R still stages and meets the barriers
    MmaStage& st = stage[wid];
    const int tile = blockIdx.y;
    const int slot = tile_slot[tile], first = tile_first[tile], n = tile_n[tile];
    const int nsub = C / 32, spb = Fmt<QT>::QK / 32, nxd = nsub >> xd_shift;
    const i64 row_bytes = (i64)(C / Fmt<QT>::QK) * Fmt<QT>::BB;
    // the decoding lane: row dr, half dh (GATE_UP: the matrix; down: the sub-block's parity)
    const int dr = lane & 15, dh = lane >> 4;
    const int drow = min(r0 + dr, R - 1);  // past R: a real row decoded, its results not kept
    const u8* dsrc = (GATE_UP && dh ? wb : wa) + slot * slot_stride + (i64)drow * row_bytes;
    const int div = GATE_UP ? K : 1;
    const int nblk = (n + 7) / 8;  // column blocks in use (uniform across the warp)
    constexpr int NM = GATE_UP ? 2 : 1;
    float acc[NM][NB][4];
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[m][nb][q] = 0.0f;
    const int step = GATE_UP ? 1 : 2;
    for (int k0 = 0; k0 < nsub; k0 += KC) {
        const int kn = min((int)KC, nsub - k0);
        __syncthreads();  // the last chunk's fragment reads are done
        // 16-byte piece p of a row: sub-block p / 2, half p & 1 (ints 0-3 or 4-7)
        for (int i = threadIdx.x; i < NB * 8 * 2 * KC; i += MMA_WARPS * 32) {
            const int c = i / (2 * KC), p = i % (2 * KC), ks = p >> 1, hf = p & 1;
            i32x4 v = {0, 0, 0, 0};
            if (c < n && ks < kn)
                v = *(const i32x4*)(xq + (i64)(pair_order[first + c] / div) * C +
                                    (k0 + ks) * 32 + 16 * hf);
            int* d = &xs[c][8 * ks + hf];
            d[0] = v.x;
            d[2] = v.y;
            d[4] = v.z;
            d[6] = v.w;
        }
        for (int i = threadIdx.x; i < NB * 8 * KC; i += MMA_WARPS * 32) {
            const int c = i / KC, ks = i % KC;
            xds[c][ks] = c < n && ks < kn
                             ? xd[(i64)(pair_order[first + c] / div) * nxd + ((k0 + ks) >> xd_shift)]
                             : 0.0f;
        }
        // the chunk's bytes of row i start at (row i) + cbo; lane l decodes from its row's copy
        const i64 cbo = (i64)(k0 * 32 / Fmt<QT>::QK) * Fmt<QT>::BB;
        if (WSTAGE && live) {
            const int cb = kn * 32 / Fmt<QT>::QK * Fmt<QT>::BB;
            for (int p = lane; p < NR * (WB / 16); p += 32) {
                const int i = p / (WB / 16), k = p % (WB / 16);
                const u8* src = (GATE_UP && i >= 16 ? wb : wa) + slot * slot_stride +
                                (i64)min(r0 + (i & 15), R - 1) * row_bytes + cbo;
                const int o = (int)((u64)src & 15u);
                if (k < ((o + cb + 15) >> 4))
                    ((i32x4*)&wst[wid][i * WB])[k] = ((const i32x4*)(src - o))[k];
            }
        }
        const u8* drow_st = &wst[wid][((GATE_UP ? dh * 16 : 0) + dr) * WB] +
                            ((u64)(dsrc + cbo) & 15u);  // this lane's row, the chunk's first block
        __syncthreads();
        if (!live) continue;
    for (int sb = k0; sb < k0 + kn; sb += step) {
        const int dsb = GATE_UP ? sb : sb + dh;  // the sub-block this lane decodes
        int w[8];
        float s0 = 0.0f, s1 = 0.0f, mn = 0.0f;
        if (dsb < nsub) {
            const u8* blk = WSTAGE ? drow_st + ((dsb - k0) / spb) * Fmt<QT>::BB  // k0: whole blocks
                                   : dsrc + (i64)(dsb / spb) * Fmt<QT>::BB;
            Fmt<QT>::decode(blk, dsb % spb, w, s0, s1, mn);
        } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) w[k] = 0;
        }
        __syncwarp();  // the last iteration's reads of the stage are done
        i32x4* wd = (i32x4*)st.w[dh][dr];
        wd[0] = i32x4{w[0], w[1], w[2], w[3]};
        wd[1] = i32x4{w[4], w[5], w[6], w[7]};
        st.s[dh][dr][0] = s0;
        st.s[dh][dr][1] = s1;
        st.s[dh][dr][2] = mn;
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int sub = GATE_UP ? sb : sb + h;
            if (sub >= nsub) break;  // uniform
            const int m = GATE_UP ? h : 0;
            const int alo0 = st.w[h][g][t4], alo1 = st.w[h][g + 8][t4];
            const int ahi0 = st.w[h][g][4 + t4], ahi1 = st.w[h][g + 8][4 + t4];
            const float sa0 = st.s[h][g][0], sa1 = st.s[h][g][1], sam = st.s[h][g][2];
            const float sb0 = st.s[h][g + 8][0], sb1 = st.s[h][g + 8][1], sbm = st.s[h][g + 8][2];
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                if (nb >= nblk) break;  // uniform
                const int ks = sub - k0;
                const int2 xv = *(const int2*)&xs[nb * 8 + g][8 * ks + 2 * t4];
                const int xlo = xv.x, xhi = xv.y;
                int lo[4], hi[4];
                mma_s8_k16(lo, alo0, alo1, xlo);
                mma_s8_k16(hi, ahi0, ahi1, xhi);
                int sx0 = 0, sx1 = 0;
                if (Fmt<QT>::HAS_MIN) {  // sum of column g's 32 values, then columns 2t4, 2t4+1
                    int s = sum4(xhi, sum4(xlo, 0));
                    s += __shfl_xor_sync(0xffffffffu, s, 1);
                    s += __shfl_xor_sync(0xffffffffu, s, 2);
                    sx0 = __shfl_sync(0xffffffffu, s, 8 * t4);
                    sx1 = __shfl_sync(0xffffffffu, s, 8 * t4 + 4);
                }
                const float dx0 = xds[nb * 8 + 2 * t4][ks], dx1 = xds[nb * 8 + 2 * t4 + 1][ks];
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const bool top = q < 2;
                    float r = (top ? sa0 : sb0) * (float)lo[q] + (top ? sa1 : sb1) * (float)hi[q];
                    if (Fmt<QT>::HAS_MIN) r -= (top ? sam : sbm) * (float)(q & 1 ? sx1 : sx0);
                    acc[m][nb][q] += (q & 1 ? dx1 : dx0) * r;
                }
            }
        }
    }
    }  // the chunk
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int row = r0 + g + (q < 2 ? 0 : 8), col = nb * 8 + 2 * t4 + (q & 1);
            if (row >= R || col >= n) continue;
            const i64 p = pair_order[first + col];
            if (GATE_UP) {
                const float gv = acc[0][nb][q], uv = acc[NM - 1][nb][q];
                out[p * ldo + row] = gv / (1.0f + expf(-gv)) * uv;
            } else {
                float v = acc[0][nb][q];
                if (bias) v += bias[row];
                if (resid) v += resid[p * ldo + row];
                out[p * ldo + row] = v;
            }
        }
    }
}
#endif  // HAS_MMA_S8

#if HAS_MMA_S8
#define MMA_BODY(...) moe_tiles_mma<__VA_ARGS__>
#else
#define MMA_BODY(...) (void)
#endif

#define MOE_MMA_KERNELS(name, QT)                                                              \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32) moe_gate_up_mma_##name(       \
        const u8* gate, const u8* up, i64 slot_stride, const i8* hq, const float* hd,          \
        int xd_shift, const i32* tile_slot, const i32* tile_first, const i32* tile_n,          \
        const i32* pair_order, int K, float* act, int F, int D, const i32* ntiles) {           \
        PDL_ENTER();                                                                           \
        if (ntiles && (int)blockIdx.y >= ntiles[0]) return; /* past the card-grouped tiles */  \
        MMA_BODY(QT, true, MMA_NT / 8, false)(gate, up, slot_stride, hq, hd,                   \
                                                       xd_shift, tile_slot,                    \
                                       tile_first, tile_n, pair_order, K, act, F, D, nullptr,  \
                                       nullptr, F);                                            \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32) moe_down_mma_##name(          \
        const u8* down, i64 slot_stride, const i8* aq, const float* ad, int xd_shift,          \
        const i32* tile_slot, const i32* tile_first, const i32* tile_n, const i32* pair_order, \
        float* y, int D, int F, const float* bias, const float* resid, int ldo,                \
        const i32* ntiles) {                                                                   \
        PDL_ENTER();                                                                           \
        if (ntiles && (int)blockIdx.y >= ntiles[0]) return;                                    \
        MMA_BODY(QT, false, MMA_NT / 8, false)(down, down, slot_stride, aq, ad,                \
                                                        xd_shift, tile_slot,                   \
                                        tile_first, tile_n, pair_order, 1, y, D, F, bias,      \
                                        resid, ldo);                                           \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32) dense_mma_##name(             \
        const u8* w, i64 slot_stride, const i8* aq, const float* ad, int xd_shift,             \
        const i32* tile_slot, const i32* tile_first, const i32* tile_n, const i32* pair_order, \
        float* y, int D, int F, const float* bias, const float* resid, int ldo) {              \
        PDL_ENTER();                                                                           \
        MMA_BODY(QT, false, MMA_DENSE_NT / 8, MMA_WS_DENSE(QT))(w, w, slot_stride, aq, ad,     \
                                                                xd_shift, tile_slot,           \
                                              tile_first, tile_n, pair_order, 1, y, D, F,      \
                                              bias, resid, ldo);                               \
    }
QFORMATS(MOE_MMA_KERNELS)
