// Causal prompt attention over an f16 KV cache on the f16 tensor cores (mma.sync m16n8k16, f32
// accumulators), for CUDA sm_80+ (elsewhere the kernel is empty and the caller keeps
// attention.cu's): the function of attention.cu's three launches in one, with the same roundings
// (q as f16, scores in float32, each probability rounded to f16 *after* normalizing, then met
// with the f16 V in float32 sums; expf).
//   attn_prefill_mma  grid (ceil(T / 64), H), block 128: 4 warps, each 16 query rows (the mma's
//     M) of head h, the block's 64 rows sharing the K/V tiles of 64 keys of KV head h / (H / G)
//     staged in shared memory (rows padded by 4 words: the fragment reads are conflict-free).
//     The final max and sum are needed before any probability is rounded, so two passes over
//     the key tiles up to the causal limit of the block's last row:
//     pass 1  S = Q K^T per tile, masked and scaled; each lane keeps a running (max, sum exp)
//             of its own columns, merged over its quad at the end: the row's M and L;
//     pass 2  S again (the same instructions: the same values), p = f16(exp(s - M) / L) packed
//             straight into A fragments (the C layout of two n8 blocks is the A layout of one k16
//             step), O += P V with V's B fragments by ldmatrix.trans, O stored to out [T, H*Dv].
// Query t sees keys 0..pos0+t. Keys past S = pos0 + T are staged as zeros (a zero probability
// times a stale NaN would be NaN); rows past T compute on zero q and are not stored. The
// latest query tiles (the most keys) go first. Dh, Dv multiples of 16, at most AMMA_MAX_D.
// Fragments (PTX ISA, mma.m16n8k16 .f16; lane = 4 g + t): A regs (row g, k 2t, 2t + 1),
// (row g + 8, k 2t, 2t + 1), (row g, k 2t + 8, 2t + 9), (row g + 8, k 2t + 8, 2t + 9); B regs
// (k 2t, 2t + 1 of column g), (k 2t + 8, 2t + 9 of column g); C: rows g / g + 8, columns 2t,
// 2t + 1. An .f16x2 register holds the lower index in its low half.
#include "common.cuh"

#define AMMA_ROWS 64                  // query rows per block: 4 warps of 16
#define AMMA_THREADS 128              // 4 warps
#define AMMA_KEYS 64                  // keys per staged tile: 8 n8 blocks, 4 k16 steps
#define AMMA_MAX_D 128                // Dh, Dv at most (attention.cu's ATT_MAX_DH)
#define AMMA_LD (AMMA_MAX_D / 2 + 4)  // words per staged row at most (D / 2 + 4 in use)

#if !defined(__HIP__) && !defined(GPU_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define HAS_MMA_F16 1
#else
#define HAS_MMA_F16 0
#endif

#if HAS_MMA_F16
__device__ __forceinline__ void mma_f16_k16(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// four 8x8 b16 matrices, transposed: lanes 8i..8i+7 give the row addresses of matrix i; each
// lane gets (rows 2t, 2t + 1; column g) of every matrix: the B fragment of rows-as-k storage
__device__ __forceinline__ void ldsm_x4_trans(u32* r, const u32* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    return (u32)f2h(lo) | ((u32)f2h(hi) << 16);
}

// keys [s0, s0 + AMMA_KEYS) of one head's [S_cap, D] cache rows into shared rows of ld words
// (16-byte chunks over the block); keys >= S as zeros
__device__ __forceinline__ void amma_stage(const u16* __restrict__ src, int D, int s0, int S,
                                           u32* dst, int ld) {
    const int chunks = D / 8;
    for (int c = threadIdx.x; c < AMMA_KEYS * chunks; c += blockDim.x) {
        const int row = c / chunks, col = c - row * chunks;
        i32x4 v = i32x4{0, 0, 0, 0};
        if (s0 + row < S) v = *(const i32x4*)(src + (i64)(s0 + row) * D + col * 8);
        *(i32x4*)(dst + row * ld + col * 4) = v;
    }
}

// sc[nb][.] = the warp's 16 rows of Q times keys nb*8.. of the staged tile (unscaled)
__device__ __forceinline__ void amma_scores(float (*sc)[4], const u32 (*qa)[4], const u32* ks,
                                            int ld, int nk, int g, int t4) {
#pragma unroll
    for (int nb = 0; nb < AMMA_KEYS / 8; ++nb)
#pragma unroll
        for (int c = 0; c < 4; ++c) sc[nb][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < AMMA_MAX_D / 16; ++kk) {
        if (kk < nk) {  // uniform
#pragma unroll
            for (int nb = 0; nb < AMMA_KEYS / 8; ++nb) {
                const u32* kr = ks + (nb * 8 + g) * ld + kk * 8 + t4;  // key nb*8+g, dims 16kk+2t
                mma_f16_k16(sc[nb], qa[kk], kr[0], kr[4]);
            }
        }
    }
}

// (m, l) <- the merge of two running (max, sum of exp(x - max)); -inf max: nothing seen yet
__device__ __forceinline__ void amma_merge(float& m, float& l, float mo, float lo) {
    const float mm = fmaxf(m, mo);
    if (mm == NEG_INF) return;
    l = (m == NEG_INF ? 0.0f : l * expf(m - mm)) + (mo == NEG_INF ? 0.0f : lo * expf(mo - mm));
    m = mm;
}

__device__ __forceinline__ void attn_prefill_mma_t(const float* __restrict__ q,
                                                   const u16* __restrict__ k_cache,
                                                   const u16* __restrict__ v_cache, int S_cap,
                                                   int Dh, int Dv, int H, int G, int T, int pos0,
                                                   float scale, float* __restrict__ out) {
    __shared__ i32x4 ks4[AMMA_KEYS * AMMA_LD / 4];
    __shared__ i32x4 vs4[AMMA_KEYS * AMMA_LD / 4];
    u32* ks = (u32*)ks4;
    u32* vs = (u32*)vs4;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, kvh = h / (H / G);
    const int S = pos0 + T;
    const int r0 = (gridDim.x - 1 - blockIdx.x) * AMMA_ROWS;  // the block's first query row
    const int wr0 = r0 + wid * 16;                             // the warp's
    const int ra = wr0 + g, rb = ra + 8;                       // the lane's two rows
    // last visible key of the lane's rows, of the warp's last row, of the block's last row
    // (rows past T: row T-1's)
    const int lim_a = pos0 + min(ra, T - 1), lim_b = pos0 + min(rb, T - 1);
    const int wlast = pos0 + min(wr0 + 15, T - 1);
    const int ntiles = (pos0 + min(r0 + AMMA_ROWS - 1, T - 1)) / AMMA_KEYS + 1;
    const int ldk = Dh / 2 + 4, ldv = Dv / 2 + 4, nk = Dh / 16, nvb = Dv / 16;
    const u16* kg = k_cache + (i64)kvh * S_cap * Dh;
    const u16* vg = v_cache + (i64)kvh * S_cap * Dv;

    u32 qa[AMMA_MAX_D / 16][4];  // Q's A fragments per k16 step (f16 values: exact)
    {
        const float* qra = q + ((i64)min(ra, T - 1) * H + h) * Dh;
        const float* qrb = q + ((i64)min(rb, T - 1) * H + h) * Dh;
        const float za = ra < T ? 1.0f : 0.0f, zb = rb < T ? 1.0f : 0.0f;
#pragma unroll
        for (int kk = 0; kk < AMMA_MAX_D / 16; ++kk) {
            if (kk < nk) {
                const int d = kk * 16 + 2 * t4;
                qa[kk][0] = pack_f16x2(za * qra[d], za * qra[d + 1]);
                qa[kk][1] = pack_f16x2(zb * qrb[d], zb * qrb[d + 1]);
                qa[kk][2] = pack_f16x2(za * qra[d + 8], za * qra[d + 9]);
                qa[kk][3] = pack_f16x2(zb * qrb[d + 8], zb * qrb[d + 9]);
            } else {
                qa[kk][0] = qa[kk][1] = qa[kk][2] = qa[kk][3] = 0u;
            }
        }
    }

    // pass 1: per lane a running (max, sum exp) of its columns, rows a (g) and b (g + 8)
    float m_a = NEG_INF, l_a = 0.0f, m_b = NEG_INF, l_b = 0.0f;
    for (int j = 0; j < ntiles; ++j) {
        const int s0 = j * AMMA_KEYS;
        __syncthreads();  // the last tile's reads are done
        amma_stage(kg, Dh, s0, S, ks, ldk);
        __syncthreads();
        // warp-uniform: no key of the tile visible to the warp, or no row of it below T
        if (s0 > wlast || wr0 >= T) continue;
        float sc[AMMA_KEYS / 8][4];
        amma_scores(sc, qa, ks, ldk, nk, g, t4);
        float ta = NEG_INF, tb = NEG_INF;
#pragma unroll
        for (int nb = 0; nb < AMMA_KEYS / 8; ++nb) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int s = s0 + nb * 8 + 2 * t4 + (c & 1);
                const bool top = c < 2;
                // __fmul_rn: the product rounded alone (no fma into a later subtraction)
                const float v = s <= (top ? lim_a : lim_b) ? __fmul_rn(sc[nb][c], scale) : NEG_INF;
                sc[nb][c] = v;
                if (top) ta = fmaxf(ta, v);
                else tb = fmaxf(tb, v);
            }
        }
        float ea = 0.0f, eb = 0.0f;
#pragma unroll
        for (int nb = 0; nb < AMMA_KEYS / 8; ++nb) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const float v = sc[nb][c];
                if (c < 2) ea += v == NEG_INF ? 0.0f : expf(v - ta);
                else eb += v == NEG_INF ? 0.0f : expf(v - tb);
            }
        }
        amma_merge(m_a, l_a, ta, ea);
        amma_merge(m_b, l_b, tb, eb);
    }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {  // the quad's columns: the row's max and sum
        const float ma = __shfl_xor_sync(0xffffffffu, m_a, o);
        const float la = __shfl_xor_sync(0xffffffffu, l_a, o);
        const float mb = __shfl_xor_sync(0xffffffffu, m_b, o);
        const float lb = __shfl_xor_sync(0xffffffffu, l_b, o);
        amma_merge(m_a, l_a, ma, la);
        amma_merge(m_b, l_b, mb, lb);
    }

    // pass 2: p = f16(exp(s - M) / L) as A fragments, O += P V
    float acc[AMMA_MAX_D / 8][4];
#pragma unroll
    for (int nb = 0; nb < AMMA_MAX_D / 8; ++nb)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[nb][c] = 0.0f;
    // ldmatrix rows: matrix mi = lane / 8 is (keys +8 if mi odd) x (dims +8 if mi >= 2)
    const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = (lane >> 4) * 4;  // key, word
    for (int j = 0; j < ntiles; ++j) {
        const int s0 = j * AMMA_KEYS;
        __syncthreads();
        amma_stage(kg, Dh, s0, S, ks, ldk);
        amma_stage(vg, Dv, s0, S, vs, ldv);
        __syncthreads();
        if (s0 > wlast || wr0 >= T) continue;
        float sc[AMMA_KEYS / 8][4];
        amma_scores(sc, qa, ks, ldk, nk, g, t4);
        u32 pa[AMMA_KEYS / 16][4];  // per k16 step of keys
#pragma unroll
        for (int nb = 0; nb < AMMA_KEYS / 8; ++nb) {
            float p[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int s = s0 + nb * 8 + 2 * t4 + (c & 1);
                const bool top = c < 2;
                const float v = __fmul_rn(sc[nb][c], scale);
                p[c] = s <= (top ? lim_a : lim_b) ? expf(v - (top ? m_a : m_b)) / (top ? l_a : l_b)
                                                  : 0.0f;
            }
            // n8 block nb is half (nb & 1) of k16 step nb / 2: regs 0, 1 (low) or 2, 3 (high)
            pa[nb / 2][2 * (nb & 1)] = pack_f16x2(p[0], p[1]);
            pa[nb / 2][2 * (nb & 1) + 1] = pack_f16x2(p[2], p[3]);
        }
#pragma unroll
        for (int kk = 0; kk < AMMA_KEYS / 16; ++kk) {
            if (s0 + kk * 16 > wlast) break;  // uniform: all 16 keys masked for the warp
            const u32* vr = vs + (kk * 16 + lr) * ldv + lc;
#pragma unroll
            for (int vb = 0; vb < AMMA_MAX_D / 16; ++vb) {
                if (vb < nvb) {
                    u32 b[4];  // dims 16vb..+7: b[0], b[1]; dims 16vb+8..: b[2], b[3]
                    ldsm_x4_trans(b, vr + vb * 8);
                    mma_f16_k16(acc[2 * vb], pa[kk], b[0], b[1]);
                    mma_f16_k16(acc[2 * vb + 1], pa[kk], b[2], b[3]);
                }
            }
        }
    }
    const i64 ld_out = (i64)H * Dv;
#pragma unroll
    for (int nb = 0; nb < AMMA_MAX_D / 8; ++nb) {
        if (nb < Dv / 8) {
            const int d = h * Dv + nb * 8 + 2 * t4;
            if (ra < T) {
                out[ra * ld_out + d] = acc[nb][0];
                out[ra * ld_out + d + 1] = acc[nb][1];
            }
            if (rb < T) {
                out[rb * ld_out + d] = acc[nb][2];
                out[rb * ld_out + d + 1] = acc[nb][3];
            }
        }
    }
}
#endif  // HAS_MMA_F16

extern "C" __global__ void __launch_bounds__(AMMA_THREADS)
    attn_prefill_mma(const float* __restrict__ q, const u16* __restrict__ k_cache,
                     const u16* __restrict__ v_cache, int S_cap, int Dh, int Dv, int H, int G,
                     int T, int pos0, float scale, float* __restrict__ out) {
    PDL_ENTER();
#if HAS_MMA_F16
    attn_prefill_mma_t(q, k_cache, v_cache, S_cap, Dh, Dv, H, G, T, pos0, scale, out);
#endif
}
