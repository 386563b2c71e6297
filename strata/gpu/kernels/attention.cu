// Attention over the KV cache (f16, or int8 with a scale per row: see below), split along the
// keys (flash-decoding), for decode and for causal prefill, with llama.cpp's roundings: q as f16
// values, scores in float32, softmax probabilities rounded to f16 *after* normalization (they
// meet the f16 V as f16).
//
// Because the f16 rounding needs the final max and sum, the probabilities cannot be folded
// online; three launches instead, all deterministic (fixed reduction orders, no atomics):
//   attn_scores   grid (tiles, G, T), block ATT_TILE: the tile's keys are staged in shared
//                 memory with coalesced 16-byte loads, then one thread per key computes the
//                 scores of the `rep` query heads sharing its KV head (GQA: K read once),
//                 writes them [T*H, ss] and the tile's (max, sum exp) per head.
//   attn_pv       grid (splits, G, T), block Dv: global max/sum from the tile partials, then
//                 per V tile (staged like K) p = f16(exp(s - M) / L) and o_part += p * V.
//   attn_combine  grid (T*H), block Dv: o = sum of the split partials (already normalized).
// Query t sees keys 0..pos0+t (causal); S = pos0 + T keys are valid. A sliding layer (window
// W > 0) masks the keys before pos0+t-W+1 too; attention sinks (`sinks` [H], not null: gpt-oss)
// add exp(sink[h] - M) to a head's softmax denominator, M the max over the scores and the sink. Dh, Dv <= ATT_MAX_DH and
// multiples of 8; H / G <= ATT_MAX_REP (accumulators past rep are computed, never stored).
//
// The cache element type is a template argument (KvF16, KvI8) of every kernel: the int8 cache
// (`_i8` kernels) holds quants q with one float scale d per row ([G, S_cap] beside the cache),
// a row being x = q * d. The scores take d once per key (q.k8 * d * scale); V's d is folded into
// the key's probability after its f16 rounding (f16(p) * d, then * v8).
#include "common.cuh"

#define ATT_TILE 64
#define ATT_MAX_REP 16
#define ATT_MAX_DH 128

struct alignas(8) i32x2 {
    int x, y;
};

// f16 cache: a chunk of 8 dims is 16 bytes (4 words of 2 halves); no scales
struct KvF16 {
    typedef u16 T;
    typedef i32x4 Chunk;
    enum { CW = 4, W4 = 2 };  // words per chunk, words per 4 dims
    static __device__ __forceinline__ int words(int D) { return D / 2; }
    static __device__ __forceinline__ Chunk zero() { return i32x4{0, 0, 0, 0}; }
    static __device__ __forceinline__ void put(u32* d, const Chunk& v) {
        d[0] = (u32)v.x;
        d[1] = (u32)v.y;
        d[2] = (u32)v.z;
        d[3] = (u32)v.w;
    }
    static __device__ __forceinline__ void unpack8(const Chunk& c, float* f) {
        const u32 w4[4] = {(u32)c.x, (u32)c.y, (u32)c.z, (u32)c.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            f[2 * e] = h2f((u16)w4[e]);
            f[2 * e + 1] = h2f((u16)(w4[e] >> 16));
        }
    }
    // dims 4j..4j+3 of a staged row (kr: its words, w = W4 * j)
    static __device__ __forceinline__ void get4(const u32* kr, int w, float& k0, float& k1,
                                                float& k2, float& k3) {
        const u32 ka = kr[w], kb = kr[w + 1];
        k0 = h2f((u16)ka), k1 = h2f((u16)(ka >> 16));
        k2 = h2f((u16)kb), k3 = h2f((u16)(kb >> 16));
    }
    static __device__ __forceinline__ float elem(const u32* base, int i) {
        return h2f(((const u16*)base)[i]);
    }
    static __device__ __forceinline__ float scale_at(const float*, i64) { return 1.0f; }
    static __device__ __forceinline__ float scaled(float x, float) { return x; }
};

// int8 cache: a chunk of 8 dims is 8 bytes (2 words of 4 quants); a float scale per row
struct KvI8 {
    typedef i8 T;
    typedef i32x2 Chunk;
    enum { CW = 2, W4 = 1 };
    static __device__ __forceinline__ int words(int D) { return D / 4; }
    static __device__ __forceinline__ Chunk zero() { return i32x2{0, 0}; }
    static __device__ __forceinline__ void put(u32* d, const Chunk& v) {
        d[0] = (u32)v.x;
        d[1] = (u32)v.y;
    }
    static __device__ __forceinline__ void unpack8(const Chunk& c, float* f) {
        const u32 w2[2] = {(u32)c.x, (u32)c.y};
#pragma unroll
        for (int e = 0; e < 2; ++e)
#pragma unroll
            for (int b = 0; b < 4; ++b) f[4 * e + b] = (float)(i8)(w2[e] >> (8 * b));
    }
    static __device__ __forceinline__ void get4(const u32* kr, int w, float& k0, float& k1,
                                                float& k2, float& k3) {
        const u32 ka = kr[w];
        k0 = (float)(i8)ka, k1 = (float)(i8)(ka >> 8);
        k2 = (float)(i8)(ka >> 16), k3 = (float)(i8)(ka >> 24);
    }
    static __device__ __forceinline__ float elem(const u32* base, int i) {
        return (float)((const i8*)base)[i];
    }
    static __device__ __forceinline__ float scale_at(const float* s, i64 i) { return s[i]; }
    static __device__ __forceinline__ float scaled(float x, float d) { return x * d; }
};

// rows [s0, s0 + n) of a [S_cap, D] cache (D multiple of 8) into shared memory, row stride `ld`
// words (u32), by chunk loads (8 dims each: 16 bytes f16, 8 bytes int8) spread over the block
template <typename KV>
__device__ __forceinline__ void stage_rows(const typename KV::T* __restrict__ src, int D, int n,
                                           u32* dst, int ld) {
    const int chunks = D / 8;  // chunks per row
    for (int c = threadIdx.x; c < n * chunks; c += blockDim.x) {
        const int row = c / chunks, col = c - row * chunks;
        const typename KV::Chunk v = *(const typename KV::Chunk*)(src + (i64)row * D + col * 8);
        KV::put(dst + row * ld + col * KV::CW, v);
    }
}

// a head's attention sink joins its (max, sum exp) (m, l): in the denominator only
__device__ __forceinline__ void sink_fold(const float* __restrict__ sinks, int h, float& m,
                                          float& l) {
    if (!sinks) return;
    const float sk = sinks[h], mm = fmaxf(m, sk);
    l = l * expf(m - mm) + expf(sk - mm);
    m = mm;
}

template <typename KV>
__device__ __forceinline__ void attn_scores_t(const float* __restrict__ q,
                                              const typename KV::T* __restrict__ k_cache,
                                              const float* __restrict__ k_scale, int S_cap,
                                              int Dh, int H, int G, int pos0, int S, float scale,
                                              float* __restrict__ scores, int ss,
                                              float* __restrict__ pmax, float* __restrict__ psum,
                                              int ntc, int window) {
    __shared__ f32x4 qs4[ATT_MAX_REP * ATT_MAX_DH / 4];
    __shared__ u32 ks[ATT_TILE * (ATT_MAX_DH / 2 + 1)];  // +1 word per row: no bank conflicts
    float* qs = (float*)qs4;
    __shared__ float red[1024 / WARP_SIZE];
    const int tile = blockIdx.x, g = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int rep = H / G, ld = KV::words(Dh) + 1;
    const int s0 = tile * ATT_TILE, s = s0 + tid;
    for (int k = tid; k < rep * Dh; k += blockDim.x)
        qs[k] = q[((i64)t * H + g * rep) * Dh + k];  // heads g*rep.. are contiguous
    stage_rows<KV>(k_cache + ((i64)g * S_cap + s0) * Dh, Dh, min(ATT_TILE, S - s0), ks, ld);
    __syncthreads();
    const bool valid = s < S && s <= pos0 + t && (window <= 0 || s > pos0 + t - window);
    const float kd = valid ? KV::scale_at(k_scale, (i64)g * S_cap + s) : 0.0f;  // int8: row's d
    float acc[ATT_MAX_REP];
#pragma unroll
    for (int r = 0; r < ATT_MAX_REP; ++r) acc[r] = 0.0f;
    if (valid) {
        const u32* kr = ks + tid * ld;
        for (int w = 0; w < KV::words(Dh); w += KV::W4) {  // 4 dims a step: one q load a head
            float k0, k1, k2, k3;
            KV::get4(kr, w, k0, k1, k2, k3);
#pragma unroll
            for (int r = 0; r < ATT_MAX_REP; ++r) {
                if (r < rep) {
                    const f32x4 qv = qs4[(r * Dh) / 4 + w / KV::W4];
                    acc[r] += qv.x * k0 + qv.y * k1 + qv.z * k2 + qv.w * k3;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_MAX_REP; ++r) {
        if (r < rep) {  // block-uniform
            const float sc = valid ? KV::scaled(acc[r], kd) * scale : NEG_INF;
            const i64 row = (i64)t * H + g * rep + r;
            if (s < S) scores[row * ss + s] = sc;
            const float m = block_max_f32(sc, red);
            const float e = (valid && m != NEG_INF) ? expf(sc - m) : 0.0f;
            const float l = block_sum_f32(e, red);
            if (tid == 0) {
                pmax[row * ntc + tile] = m;
                psum[row * ntc + tile] = l;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(ATT_TILE)
    attn_scores(const float* __restrict__ q, const u16* __restrict__ k_cache, int S_cap, int Dh,
                int H, int G, int pos0, int S, float scale, float* __restrict__ scores, int ss,
                float* __restrict__ pmax, float* __restrict__ psum, int ntc, int window) {
    PDL_ENTER();
    attn_scores_t<KvF16>(q, k_cache, nullptr, S_cap, Dh, H, G, pos0, S, scale, scores, ss, pmax,
                         psum, ntc, window);
}

extern "C" __global__ void __launch_bounds__(ATT_TILE)
    attn_scores_i8(const float* __restrict__ q, const i8* __restrict__ k_cache,
                   const float* __restrict__ k_scale, int S_cap, int Dh, int H, int G, int pos0,
                   int S, float scale, float* __restrict__ scores, int ss,
                   float* __restrict__ pmax, float* __restrict__ psum, int ntc, int window) {
    PDL_ENTER();
    attn_scores_t<KvI8>(q, k_cache, k_scale, S_cap, Dh, H, G, pos0, S, scale, scores, ss, pmax,
                        psum, ntc, window);
}

template <typename KV>
__device__ __forceinline__ void attn_pv_t(const float* __restrict__ scores, int ss,
                                          const float* __restrict__ pmax,
                                          const float* __restrict__ psum, int ntc, int ntiles,
                                          const typename KV::T* __restrict__ v_cache,
                                          const float* __restrict__ v_scale, int S_cap, int Dv,
                                          int H, int G, int S, int chunk,
                                          float* __restrict__ o_part, int nsplit,
                                          const float* __restrict__ sinks) {
    __shared__ float M[ATT_MAX_REP], L[ATT_MAX_REP];
    __shared__ f32x4 p4[ATT_TILE * ATT_MAX_REP / 4];  // p[i][r]: a key's rep probabilities
    float* p = (float*)p4;
    __shared__ u32 vs[ATT_TILE * (ATT_MAX_DH / 2)];
    __shared__ float red[1024 / WARP_SIZE];
    const int split = blockIdx.x, g = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
    const int rep = H / G;
    for (int r = 0; r < rep; ++r) {  // global max and sum of one head, the block together
        const i64 row = (i64)t * H + g * rep + r;
        float m = NEG_INF;
        for (int j = tid; j < ntiles; j += blockDim.x) m = fmaxf(m, pmax[row * ntc + j]);
        m = block_max_f32(m, red);
        float l = 0.0f;
        for (int j = tid; j < ntiles; j += blockDim.x) {
            const float mj = pmax[row * ntc + j];
            if (mj != NEG_INF) l += psum[row * ntc + j] * expf(mj - m);
        }
        l = block_sum_f32(l, red);
        if (tid == 0) {
            sink_fold(sinks, g * rep + r, m, l);
            M[r] = m;
            L[r] = l;
        }
    }
    __syncthreads();
    float acc[ATT_MAX_REP];
#pragma unroll
    for (int r = 0; r < ATT_MAX_REP; ++r) acc[r] = 0.0f;
    const int s0 = split * chunk, s1 = min(S, s0 + chunk);
    for (int base = s0; base < s1; base += ATT_TILE) {
        const int n = min(ATT_TILE, s1 - base);
        stage_rows<KV>(v_cache + ((i64)g * S_cap + base) * Dv, Dv, n, vs, KV::words(Dv));
        for (int k = tid; k < rep * ATT_TILE; k += blockDim.x) {
            const int r = k / ATT_TILE, i = k % ATT_TILE;
            float pv = 0.0f;
            if (i < n) {
                const float sc = scores[((i64)t * H + g * rep + r) * ss + base + i];
                if (sc != NEG_INF)  // int8: the V row's scale rides on its probability
                    pv = KV::scaled(round_f16(expf(sc - M[r]) / L[r]),
                                    KV::scale_at(v_scale, (i64)g * S_cap + base + i));
            }
            p[i * ATT_MAX_REP + r] = pv;
        }
        __syncthreads();
        if (tid < Dv) {
            for (int i = 0; i < n; ++i) {
                const float v = KV::elem(vs, i * Dv + tid);
#pragma unroll
                for (int j = 0; j < ATT_MAX_REP / 4; ++j) {
                    if (4 * j < rep) {
                        const f32x4 pv = p4[i * (ATT_MAX_REP / 4) + j];
                        acc[4 * j] += pv.x * v;
                        acc[4 * j + 1] += pv.y * v;
                        acc[4 * j + 2] += pv.z * v;
                        acc[4 * j + 3] += pv.w * v;
                    }
                }
            }
        }
        __syncthreads();
    }
    if (tid < Dv)
        for (int r = 0; r < rep; ++r)
            o_part[(((i64)t * H + g * rep + r) * nsplit + split) * Dv + tid] = acc[r];
}

extern "C" __global__ void __launch_bounds__(ATT_MAX_DH)
    attn_pv(const float* __restrict__ scores, int ss, const float* __restrict__ pmax,
            const float* __restrict__ psum, int ntc, int ntiles, const u16* __restrict__ v_cache,
            int S_cap, int Dv, int H, int G, int S, int chunk, float* __restrict__ o_part,
            int nsplit, const float* __restrict__ sinks) {
    PDL_ENTER();
    attn_pv_t<KvF16>(scores, ss, pmax, psum, ntc, ntiles, v_cache, nullptr, S_cap, Dv, H, G, S,
                     chunk, o_part, nsplit, sinks);
}

extern "C" __global__ void __launch_bounds__(ATT_MAX_DH)
    attn_pv_i8(const float* __restrict__ scores, int ss, const float* __restrict__ pmax,
               const float* __restrict__ psum, int ntc, int ntiles, const i8* __restrict__ v_cache,
               const float* __restrict__ v_scale, int S_cap, int Dv, int H, int G, int S,
               int chunk, float* __restrict__ o_part, int nsplit, const float* __restrict__ sinks) {
    PDL_ENTER();
    attn_pv_t<KvI8>(scores, ss, pmax, psum, ntc, ntiles, v_cache, v_scale, S_cap, Dv, H, G, S,
                    chunk, o_part, nsplit, sinks);
}

extern "C" __global__ void attn_combine(const float* __restrict__ o_part, int nsplit, int Dv,
                                        float* __restrict__ out) {
    PDL_ENTER();
    const i64 row = blockIdx.x;  // t * H + h
    const int d = threadIdx.x;
    if (d >= Dv) return;
    float o = 0.0f;
    for (int k = 0; k < nsplit; ++k) o += o_part[(row * nsplit + k) * Dv + d];
    out[row * Dv + d] = o;
}

// ---- decode (T = 1) with the position in device memory: one launch for every position ----
//
// The launches depend only on S_cap and the workspace, never on the position, so a CUDA graph
// captured once replays at every decode step. pos_dev[0] is the position of the token being
// decoded (its K/V row already appended): S = pos + 1 keys are attended. The keys are cut into
// `nlive` <= nsplit splits of `chunk` >= min_chunk keys (dec_split, a function of S, nsplit and
// min_chunk alone, so both kernels agree); blocks past nlive leave at once. Same roundings as
// above.
//   attn_dec_scores_r<R>  grid (nsplit, G), DEC_THREADS: groups of 8 lanes share a key (each
//                         lane 16-byte loads of K, the group's partial dots summed by a
//                         transposing butterfly), scores -> ws [H, ss], per split (max, sum exp).
//   attn_dec_pv_r<R>      grid (nsplit, G): global (max, sum) per head from the split partials,
//                         p = f16(exp(s - M) / L) for a tile of keys, o_part += p * V; then
//                         the splits are summed in two levels (the last block of a team of
//                         DEC_TEAM splits to finish, then the last team of the KV head, found by
//                         counters those blocks set back to 0) in a fixed order into out:
//                         deterministic, and no third launch.
// R is H/G rounded up to a power of two (1..16): the accumulator count, a template argument.
#define DEC_THREADS 128
#define DEC_TILE 32  // keys a tile of attn_dec_pv (32: fewer registers, 51 against 64 us at 32K)
#define DEC_U 4      // keys a lane group of attn_dec_scores takes per step (halved for R = 16)
#define DEC_TEAM 8   // splits summed by the last of them to finish (then the teams)
static_assert(DEC_TEAM >= 8, "the decode workspace holds teams of 8 (attention.py DEC_TEAM_MIN)");
#define DEC_PREFETCH 64  // keys of its split a decode block asks of L2 before the PDL wait

// keys lo..end-1 (a sliding layer's window: lo = end - window), S = end - lo of them; k0, k1 and
// the chunks count from lo (the kernels' cache, scale and score pointers start at row lo)
__device__ __forceinline__ void dec_split(const int* __restrict__ pos_dev, int S_cap, int nsplit,
                                          int min_chunk, int window, int& S, int& chunk,
                                          int& nlive, int& lo) {
    const int end = min(max(pos_dev[0] + 1, 1), S_cap);  // a position past the cache: no further
    lo = window > 0 ? max(0, end - window) : 0;
    S = end - lo;
    const int want = min(nsplit, (S + min_chunk - 1) / min_chunk);
    chunk = ((S + want - 1) / want + 31) & ~31;
    nlive = (S + chunk - 1) / chunk;
}

// A decode kernel's entry: the split of this position, then the PDL wait (common.cuh). The
// position is read and the first DEC_PREFETCH rows of the
// block's split of `cache` (a [S_cap, D] slice of KV head blockIdx.y) are asked of L2 *before*
// the wait, so their DRAM latency overlaps the kernel before (under PDL; without it the wait is
// a no-op). Both are safe there: the position is written at the step's start, many launches
// back (the caller's contract: attention_decode's docstring), and a prefetch only warms L2, the
// coherent level (the row rope_kv appends may still be in flight: its load comes after the wait).
// Every thread waits before any store or return.
template <typename KV>
__device__ __forceinline__ void dec_enter(const int* __restrict__ pos_dev, int S_cap, int nsplit,
                                          int min_chunk, int window,
                                          const typename KV::T* __restrict__ cache, int D, int& S,
                                          int& chunk, int& nlive, int& lo) {
    dec_split(pos_dev, S_cap, nsplit, min_chunk, window, S, chunk, nlive, lo);
    const int k0 = lo + blockIdx.x * chunk;
    if ((int)blockIdx.x < nlive) {
        const int n = min(min(chunk, DEC_PREFETCH), S - k0);
        const char* rows = (const char*)(cache + ((i64)blockIdx.y * S_cap + k0) * D);
        const int lines = (int)(((i64)n * D * (i64)sizeof(typename KV::T) + 127) / 128);
        for (int i = threadIdx.x; i < lines; i += blockDim.x) PREFETCH_L2(rows + (i64)i * 128);
    }
    PDL_WAIT();
    PDL_TRIGGER();
}

// Sums v[0..N) over the 8 lanes of an aligned lane group, halving the values each step (a lane
// keeps the half its partner does not): after the three steps a lane holds max(N/8, 1) sums,
// those of heads dec_head0<N>(li) + j. 7 shuffles for N = 8 instead of 24.
template <int N, int O>
struct GroupSum {
    static __device__ __forceinline__ void run(float* v, int li) {
        if (N > 1) {
            const bool up = (li & O) != 0;
#pragma unroll
            for (int j = 0; j < N / 2; ++j) {
                const float send = up ? v[j] : v[j + N / 2];
                const float keep = up ? v[j + N / 2] : v[j];
                v[j] = keep + SHFL_XOR(send, O);
            }
            GroupSum<(N > 1 ? N / 2 : 1), O / 2>::run(v, li);
        } else {
            v[0] += SHFL_XOR(v[0], O);
            GroupSum<1, O / 2>::run(v, li);
        }
    }
};
template <int N>
struct GroupSum<N, 0> {
    static __device__ __forceinline__ void run(float*, int) {}
};

template <int N>
__device__ __forceinline__ int dec_head0(int li) {
    int off = 0, n = N;
#pragma unroll
    for (int o = 4; o >= 1; o >>= 1) {
        if (n > 1) {
            if (li & o) off += n / 2;
            n >>= 1;
        }
    }
    return off;
}

template <typename KV, int U>
__device__ __forceinline__ void dec_load_k(typename KV::Chunk (&kv)[U][2],
                                           const typename KV::T* __restrict__ kg, int base,
                                           int k1, int li, int nch, int Dh) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
            const int c = li + 8 * cc;
            if (base + u < k1 && c < nch)
                kv[u][cc] = *(const typename KV::Chunk*)(kg + (i64)(base + u) * Dh + c * 8);
            else
                kv[u][cc] = KV::zero();
        }
    }
}

// int8: the scales of the keys dec_load_k loads, rows row0 + key (f16: nothing is read)
template <typename KV, int U>
__device__ __forceinline__ void dec_load_kd(float (&kd)[U], const float* __restrict__ k_scale,
                                            i64 row0, int base, int k1) {
#pragma unroll
    for (int u = 0; u < U; ++u)
        kd[u] = base + u < k1 ? KV::scale_at(k_scale, row0 + base + u) : 0.0f;
}

// The scores of keys [k0, k1) of KV head blockIdx.y for its rep query heads into scores
// [H, ss], and their (max, sum exp) per head h: m_dst[h * mstride], l_dst[h * mstride] (a split
// of attn_dec_scores). Every thread of the block calls it.
template <int R, typename KV>
__device__ __forceinline__ void dec_scores_run(const float* __restrict__ q,
                                               const typename KV::T* __restrict__ k_cache,
                                               const float* __restrict__ k_scale, int S_cap,
                                               int Dh, int H, int G, float scale,
                                               float* __restrict__ scores, int ss, int k0, int k1,
                                               float* m_dst, float* l_dst, int mstride) {
    constexpr int U = R >= 16 ? (DEC_U + 1) / 2 : DEC_U;  // keys a group takes per step
    constexpr int NV = R >= 8 ? R / 8 : 1;
    constexpr int NGRP = DEC_THREADS / 8;
    __shared__ f32x4 qs4[R * ATT_MAX_DH / 4];
    __shared__ float gm[NGRP * R], gl[NGRP * R];
    const int g = blockIdx.y, tid = threadIdx.x;
    const int rep = H / G, nch = Dh / 8;
    const int grp = tid >> 3, li = tid & 7;
    const typename KV::T* kg = k_cache + (i64)g * S_cap * Dh;
    typename KV::Chunk kv[U][2];
    float kd[U];
    dec_load_k<KV, U>(kv, kg, k0 + grp * U, k1, li, nch, Dh);  // in flight while q is staged
    dec_load_kd<KV, U>(kd, k_scale, (i64)g * S_cap, k0 + grp * U, k1);
    float* qs = (float*)qs4;
    // q of heads g*rep.. (contiguous): every load issued before any store (a loop that stored
    // each load before issuing the next waited one memory latency per step)
    constexpr int QPT = (R * ATT_MAX_DH + DEC_THREADS - 1) / DEC_THREADS;
    float qv[QPT];
#pragma unroll
    for (int j = 0; j < QPT; ++j) {
        const int i = tid + j * DEC_THREADS;
        qv[j] = i < rep * Dh ? q[(i64)g * rep * Dh + i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < QPT; ++j) {
        const int i = tid + j * DEC_THREADS;
        if (i < R * Dh) qs[i] = qv[j];
    }
    __syncthreads();
    const int h0 = dec_head0<R>(li);
    const bool owner = R >= 8 || (li & (8 / R - 1)) == 0;
    float m_run[NV], l_run[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
        m_run[j] = NEG_INF;
        l_run[j] = 0.0f;
    }
    for (int it = k0; it < k1; it += NGRP * U) {  // block-uniform trip count: shuffles below
        const int base = it + grp * U;
        float acc[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[u][r] = 0.0f;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
            const int c = li + 8 * cc;
            if (c < nch) {
                float kf[U][8];
#pragma unroll
                for (int u = 0; u < U; ++u) KV::unpack8(kv[u][cc], kf[u]);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if (r < rep) {
                        const f32x4 qa = qs4[(r * Dh + c * 8) / 4];
                        const f32x4 qb = qs4[(r * Dh + c * 8) / 4 + 1];
#pragma unroll
                        for (int u = 0; u < U; ++u)
                            acc[u][r] += qa.x * kf[u][0] + qa.y * kf[u][1] + qa.z * kf[u][2] +
                                         qa.w * kf[u][3] + qb.x * kf[u][4] + qb.y * kf[u][5] +
                                         qb.z * kf[u][6] + qb.w * kf[u][7];
                    }
                }
            }
        }
        float kdn[U];  // int8: this step's key scales (the loads below replace kd)
#pragma unroll
        for (int u = 0; u < U; ++u) kdn[u] = kd[u];
        dec_load_k<KV, U>(kv, kg, base + NGRP * U, k1, li, nch, Dh);  // the next step's keys
        dec_load_kd<KV, U>(kd, k_scale, (i64)g * S_cap, base + NGRP * U, k1);
#pragma unroll
        for (int u = 0; u < U; ++u) GroupSum<R, 4>::run(acc[u], li);
        if (owner) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int key = base + u;
                if (key < k1) {
#pragma unroll
                    for (int j = 0; j < NV; ++j) {
                        const int r = h0 + j;
                        if (r < rep) {
                            const float sc = KV::scaled(acc[u][j], kdn[u]) * scale;
                            scores[(i64)(g * rep + r) * ss + key] = sc;
                            if (sc > m_run[j]) {
                                l_run[j] = l_run[j] * expf(m_run[j] - sc) + 1.0f;
                                m_run[j] = sc;
                            } else {
                                l_run[j] += expf(sc - m_run[j]);
                            }
                        }
                    }
                }
            }
        }
    }
    if (owner) {
#pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int r = h0 + j;
            if (r < R) {
                gm[grp * R + r] = m_run[j];
                gl[grp * R + r] = l_run[j];
            }
        }
    }
    __syncthreads();
    if (tid < rep) {  // the split's (max, sum exp) of head tid, groups in a fixed order
        float m = NEG_INF;
        for (int k = 0; k < NGRP; ++k) m = fmaxf(m, gm[k * R + tid]);
        float l = 0.0f;
        for (int k = 0; k < NGRP; ++k)
            if (gm[k * R + tid] != NEG_INF) l += gl[k * R + tid] * expf(gm[k * R + tid] - m);
        m_dst[(i64)tid * mstride] = m;
        l_dst[(i64)tid * mstride] = l;
    }
}

template <int R, typename KV>
__device__ __forceinline__ void dec_scores(const float* __restrict__ q,
                                           const typename KV::T* __restrict__ k_cache,
                                           const float* __restrict__ k_scale,
                                           const int* __restrict__ pos_dev, int S_cap, int Dh,
                                           int H, int G, float scale, float* __restrict__ scores,
                                           int ss, float* __restrict__ pm, float* __restrict__ pl,
                                           int nsplit, int min_chunk, int window) {
    int S, chunk, nlive, lo;
    dec_enter<KV>(pos_dev, S_cap, nsplit, min_chunk, window, k_cache, Dh, S, chunk, nlive, lo);
    const int split = blockIdx.x;
    if (split >= nlive) return;  // the whole block: nothing to do at this position
    const int k0 = split * chunk, k1 = min(S, k0 + chunk);
    const i64 m0 = (i64)blockIdx.y * (H / G) * nsplit + split;  // head g * rep's (max, sum)
    dec_scores_run<R, KV>(q, k_cache + (i64)lo * Dh, k_scale ? k_scale + lo : nullptr, S_cap, Dh,
                          H, G, scale, scores + lo, ss, k0, k1, pm + m0, pl + m0, nsplit);
}

// a load that skips the (non-coherent) L1: other blocks' partials, read by a finishing block
__device__ __forceinline__ f32x4 ld_cg4(const float* p) {
#if defined(__CUDA_ARCH__) && !defined(__HIP__) && !defined(GPU_EMU)
    f32x4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
#else
    const volatile float* q = p;
    return f32x4{q[0], q[1], q[2], q[3]};
#endif
}

// The split sums of attn_dec_pv: for each of the block's rep * t4 items (head r, 4 dims d),
// dst[r * dst_h + 4 d] = the sum of rows 0..n) of src[r * src_h + 4 d + j * row] (floats), added
// in row order; a thread takes the items k = tid + i * blockDim.x one at a time, DEC_SUM_U
// of an item's rows loaded together (ceil(n / DEC_SUM_U) L2 round trips an item).
// 8 rows with teams of 8: 16 rows with teams of 16 (one round trip a level) took 150 registers
// against 131 and ran slower (62.1 against 46.6 us at 32K on the H200); staging the rows in
// shared memory by cp.async slowed the whole kernel.
#define DEC_SUM_U 8
__device__ __forceinline__ void dec_sum_rows(const float* src, i64 src_h, i64 row, int n, int rep,
                                             int t4, float* dst, i64 dst_h) {
    for (int k = threadIdx.x; k < rep * t4; k += blockDim.x) {
        const int r = k / t4, d = k - r * t4;
        const float* s = src + r * src_h + 4 * d;
        f32x4 o = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
        for (int j0 = 0; j0 < n; j0 += DEC_SUM_U) {
            f32x4 a[DEC_SUM_U];
#pragma unroll
            for (int u = 0; u < DEC_SUM_U; ++u)
                if (j0 + u < n) a[u] = ld_cg4(s + (i64)(j0 + u) * row);
#pragma unroll
            for (int u = 0; u < DEC_SUM_U; ++u) {
                if (j0 + u < n) {
                    o.x += a[u].x;
                    o.y += a[u].y;
                    o.z += a[u].z;
                    o.w += a[u].w;
                }
            }
        }
        *(f32x4*)(dst + r * dst_h + 4 * d) = o;
    }
}

// One tile of attn_dec_pv: the V rows this thread multiplies (rows slot + j * rpi of the tile,
// 8 dims at d8 each) and the scores it turns into probabilities (k = tid + j * DEC_THREADS over
// [rep, n]: coalesced over keys), with an int8 cache's V scales.
template <typename KV, int MAXRPT, int SCN>
__device__ __forceinline__ void dec_pv_load(typename KV::Chunk (&vv)[MAXRPT], float (&sc)[SCN],
                                            float (&vd)[SCN], const typename KV::T* __restrict__ vg,
                                            const float* __restrict__ srow, int ss,
                                            const float* __restrict__ v_scale, i64 vrow0,
                                            int base, int n, int rep, int Dv, int slot, int rpi,
                                            int d8, bool active) {
#pragma unroll
    for (int j = 0; j < MAXRPT; ++j) {
        const int i = slot + j * rpi;
        if (active && i < n)
            vv[j] = *(const typename KV::Chunk*)(vg + (i64)(base + i) * Dv + d8 * 8);
        else
            vv[j] = KV::zero();
    }
#pragma unroll
    for (int j = 0; j < SCN; ++j) {
        const int k = threadIdx.x + j * DEC_THREADS;
        if (k < rep * n) {
            const int r = k / n, i = k - r * n;
            sc[j] = srow[(i64)r * ss + base + i];
            vd[j] = KV::scale_at(v_scale, vrow0 + base + i);  // int8: V's d
        }
    }
}

// attn_dec_pv's global (max, sum) of each head: from the live splits' partials [H, nsplit], every
// head at once (DEC_THREADS / R threads a head, at most 32: a warp's aligned group), every block
// in the same order
struct SplitStats {
    const float* pm;
    const float* pl;
    int nsplit, nlive;
    const float* sinks;  // [H] or null (attention sinks)
    template <int R>
    __device__ __forceinline__ void run(float* Ms, float* Ls, int g, int rep) const {
        constexpr int TPH = DEC_THREADS / R < 32 ? DEC_THREADS / R : 32;
        const int tid = threadIdx.x, r = tid / TPH, j0 = tid % TPH;
        const bool mine = tid < R * TPH && r < rep;
        const float* pmr = pm + (i64)(g * rep + r) * nsplit;
        const float* plr = pl + (i64)(g * rep + r) * nsplit;
        float m = NEG_INF;
        if (mine) {
#pragma unroll 4
            for (int j = j0; j < nlive; j += TPH) m = fmaxf(m, pmr[j]);
        }
#pragma unroll
        for (int o = TPH / 2; o > 0; o >>= 1) m = fmaxf(m, SHFL_XOR(m, o));
        float l = 0.0f;
        if (mine) {
#pragma unroll 4
            for (int j = j0; j < nlive; j += TPH) l += plr[j] * expf(pmr[j] - m);
        }
#pragma unroll
        for (int o = TPH / 2; o > 0; o >>= 1) l += SHFL_XOR(l, o);
        if (mine && j0 == 0) {
            sink_fold(sinks, g * rep + r, m, l);
            Ms[r] = m;
            Ls[r] = l;
        }
    }
};

// p.V over keys [k0, k1) of KV head blockIdx.y, the (max, sum) of every head from `stats`
// (Stats::run<R>: the split partials of attn_dec_scores), into o_dst:
// head r's Dv sums at o_dst + o_off + r * o_stride. Every thread of the block calls it.
template <int R, typename KV, typename Stats>
__device__ __forceinline__ void dec_pv_run(const float* __restrict__ scores, int ss,
                                           const Stats stats,
                                           const typename KV::T* __restrict__ v_cache,
                                           const float* __restrict__ v_scale, int S_cap, int Dv,
                                           int H, int G, int k0, int k1, float* o_dst,
                                           int o_off, int o_stride) {
    constexpr int RP = R < 4 ? 4 : R;  // p row stride: f32x4 reads of 4 heads
    constexpr int RC = R < 8 ? R : 8;  // heads per round of the slot reduction
    // rows of a tile a thread holds: Dv/8 threads a row, so at least DEC_THREADS/16 rows a step
    constexpr int MAXRPT = DEC_TILE / (DEC_THREADS / (ATT_MAX_DH / 8));
    constexpr int SCN = (R * DEC_TILE + DEC_THREADS - 1) / DEC_THREADS;  // scores a thread loads
    __shared__ float Ms[R], Ls[R];
    __shared__ f32x4 p4[DEC_TILE * RP / 4];       // p[i * RP + r]
    __shared__ f32x4 red4[2 * DEC_THREADS * RC];  // [slot][RC][Dv/4]: slots * Dv <= 8 * 128
    float* p = (float*)p4;
    const int g = blockIdx.y, tid = threadIdx.x;
    const int rep = H / G;
    // V rows: Dv/8 threads each (16-byte loads, 8 dims), rpi rows per step
    const int tpr = Dv / 8, rpi = DEC_THREADS / tpr;
    const int slot = tid / tpr, d8 = tid % tpr;
    const bool active = slot < rpi;
    float acc[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][e] = 0.0f;
    const typename KV::T* vg = v_cache + (i64)g * S_cap * Dv;
    const float* srow = scores + (i64)g * rep * ss;
    const i64 vrow0 = (i64)g * S_cap;
    typename KV::Chunk vv[MAXRPT];  // the first tile's V rows and scores: in flight together,
    float sc[SCN], vd[SCN];         // and with the (max, sum) partials read below
    dec_pv_load<KV>(vv, sc, vd, vg, srow, ss, v_scale, vrow0, k0, min(DEC_TILE, k1 - k0), rep,
                    Dv, slot, rpi, d8, active);
    stats.template run<R>(Ms, Ls, g, rep);  // the global (max, sum) per head
    __syncthreads();
    for (int base = k0; base < k1; base += DEC_TILE) {
        const int n = min(DEC_TILE, k1 - base);
        // the next tile's loads go out before this tile's math (block-uniform condition)
        const int nn = min(DEC_TILE, k1 - base - DEC_TILE);
        typename KV::Chunk vn[MAXRPT];
        float scn[SCN], vdn[SCN];
        if (nn > 0)
            dec_pv_load<KV>(vn, scn, vdn, vg, srow, ss, v_scale, vrow0, base + DEC_TILE, nn, rep,
                            Dv, slot, rpi, d8, active);
#pragma unroll
        for (int j = 0; j < SCN; ++j) {
            const int k = tid + j * DEC_THREADS;
            if (k < rep * n) {
                const int r = k / n, i = k - r * n;
                p[i * RP + r] = KV::scaled(round_f16(expf(sc[j] - Ms[r]) / Ls[r]), vd[j]);
            }
        }
        __syncthreads();
        if (active) {
#pragma unroll
            for (int j = 0; j < MAXRPT; ++j) {
                const int i = slot + j * rpi;
                if (i < n) {
                    float v[8];
                    KV::unpack8(vv[j], v);
#pragma unroll
                    for (int r4 = 0; r4 < RP / 4; ++r4) {
                        if (4 * r4 < rep) {
                            const f32x4 pr = p4[(i * RP) / 4 + r4];
                            const float pq[4] = {pr.x, pr.y, pr.z, pr.w};
#pragma unroll
                            for (int k = 0; k < 4; ++k) {
                                if (4 * r4 + k < R) {
#pragma unroll
                                    for (int e = 0; e < 8; ++e) acc[4 * r4 + k][e] += pq[k] * v[e];
                                }
                            }
                        }
                    }
                }
            }
        }
        __syncthreads();
        if (nn > 0) {
#pragma unroll
            for (int j = 0; j < MAXRPT; ++j) vv[j] = vn[j];
#pragma unroll
            for (int j = 0; j < SCN; ++j) {
                sc[j] = scn[j];
                vd[j] = vdn[j];
            }
        }
    }
    // the row slots' partial sums, added in a fixed order, RC heads a round (32 KB of smem)
    const int t4 = Dv / 4;
#pragma unroll
    for (int r0 = 0; r0 < R; r0 += RC) {
        if (active) {
#pragma unroll
            for (int rr = 0; rr < RC; ++rr) {
                if (r0 + rr < rep) {
                    f32x4* dst = red4 + (slot * RC + rr) * t4 + 2 * d8;
                    dst[0] = f32x4{acc[r0 + rr][0], acc[r0 + rr][1], acc[r0 + rr][2],
                                   acc[r0 + rr][3]};
                    dst[1] = f32x4{acc[r0 + rr][4], acc[r0 + rr][5], acc[r0 + rr][6],
                                   acc[r0 + rr][7]};
                }
            }
        }
        __syncthreads();
        for (int k = tid; k < RC * t4; k += blockDim.x) {
            const int rr = k / t4, d = k - rr * t4, r = r0 + rr;
            if (r < rep) {
                f32x4 o = red4[rr * t4 + d];
                for (int sl = 1; sl < rpi; ++sl) {
                    const f32x4 a = red4[(sl * RC + rr) * t4 + d];
                    o.x += a.x;
                    o.y += a.y;
                    o.z += a.z;
                    o.w += a.w;
                }
                *(f32x4*)(o_dst + o_off + r * o_stride + 4 * d) = o;
            }
        }
        __syncthreads();
    }
}

template <int R, typename KV>
__device__ __forceinline__ void dec_pv(const float* __restrict__ scores, int ss,
                                       const float* __restrict__ pm, const float* __restrict__ pl,
                                       const typename KV::T* __restrict__ v_cache,
                                       const float* __restrict__ v_scale,
                                       const int* __restrict__ pos_dev, int S_cap, int Dv, int H,
                                       int G, float* o_part, int nsplit, int min_chunk,
                                       int* __restrict__ cnt, float* tpart,
                                       float* __restrict__ out, int window,
                                       const float* __restrict__ sinks) {
    __shared__ int last;
    int S, chunk, nlive, lo;
    dec_enter<KV>(pos_dev, S_cap, nsplit, min_chunk, window, v_cache, Dv, S, chunk, nlive, lo);
    const int split = blockIdx.x, g = blockIdx.y, tid = threadIdx.x;
    if (split >= nlive) return;
    const int rep = H / G;
    const int k0 = split * chunk, k1 = min(S, k0 + chunk);
    dec_pv_run<R, KV>(scores + lo, ss, SplitStats{pm, pl, nsplit, nlive, sinks},
                      v_cache + (i64)lo * Dv, v_scale ? v_scale + lo : nullptr, S_cap, Dv, H, G,
                      k0, k1, o_part, (g * rep * nsplit + split) * Dv, nsplit * Dv);
    // Splits are added in two levels, both in a fixed order (deterministic): the last block of
    // a team of DEC_TEAM splits to finish sums the team's partials, the last team of the KV
    // head sums the teams' into out. Counters: cnt[g] per head, then [G][nteam max] per team;
    // each is set back to 0 by the block that found itself last (ready for a graph replay).
    const int t4 = Dv / 4;
    const int ntm = (nsplit + DEC_TEAM - 1) / DEC_TEAM, nteam = (nlive + DEC_TEAM - 1) / DEC_TEAM;
    const int team = split / DEC_TEAM, t0 = team * DEC_TEAM, tn = min(DEC_TEAM, nlive - t0);
    int* tcnt = cnt + G + g * ntm + team;
    if (!block_arrive_last(tcnt, tn, last)) return;
    // one team (nlive <= DEC_TEAM): its sum is the output. The second level would add it to 0
    // (a sum that started at 0 is never -0: the same bits), after one more counter.
    const i64 h0 = (i64)g * rep;
    const float* team_rows = o_part + (h0 * nsplit + t0) * Dv;
    if (nteam == 1)
        dec_sum_rows(team_rows, nsplit * Dv, Dv, tn, rep, t4, out + h0 * Dv, Dv);
    else
        dec_sum_rows(team_rows, nsplit * Dv, Dv, tn, rep, t4, tpart + (h0 * ntm + team) * Dv,
                     ntm * Dv);
    if (tid == 0) *tcnt = 0;
    if (nteam == 1) return;
    if (!block_arrive_last(cnt + g, nteam, last)) return;
    dec_sum_rows(tpart + h0 * ntm * Dv, ntm * Dv, Dv, nteam, rep, t4, out + h0 * Dv, Dv);
    if (tid == 0) cnt[g] = 0;
}

#define ATTN_DEC_KERNELS(R)                                                                     \
    extern "C" __global__ void attn_dec_scores_r##R(                                            \
        const float* q, const u16* k_cache, const int* pos_dev, int S_cap, int Dh, int H,       \
        int G, float scale, float* scores, int ss, float* pm, float* pl, int nsplit,            \
        int min_chunk, int window) {                                                            \
        dec_scores<R, KvF16>(q, k_cache, nullptr, pos_dev, S_cap, Dh, H, G, scale, scores, ss,  \
                             pm, pl, nsplit, min_chunk, window);                                \
    }                                                                                           \
    extern "C" __global__ void attn_dec_pv_r##R(                                                \
        const float* scores, int ss, const float* pm, const float* pl, const u16* v_cache,      \
        const int* pos_dev, int S_cap, int Dv, int H, int G, float* o_part, int nsplit,         \
        int min_chunk, int* cnt, float* tpart, float* out, int window, const float* sinks) {    \
        dec_pv<R, KvF16>(scores, ss, pm, pl, v_cache, nullptr, pos_dev, S_cap, Dv, H, G,        \
                         o_part, nsplit, min_chunk, cnt, tpart, out, window, sinks);            \
    }                                                                                           \
    extern "C" __global__ void attn_dec_scores_i8_r##R(                                         \
        const float* q, const i8* k_cache, const float* k_scale, const int* pos_dev, int S_cap, \
        int Dh, int H, int G, float scale, float* scores, int ss, float* pm, float* pl,         \
        int nsplit, int min_chunk, int window) {                                                \
        dec_scores<R, KvI8>(q, k_cache, k_scale, pos_dev, S_cap, Dh, H, G, scale, scores, ss,   \
                            pm, pl, nsplit, min_chunk, window);                                 \
    }                                                                                           \
    extern "C" __global__ void attn_dec_pv_i8_r##R(                                             \
        const float* scores, int ss, const float* pm, const float* pl, const i8* v_cache,       \
        const float* v_scale, const int* pos_dev, int S_cap, int Dv, int H, int G,              \
        float* o_part, int nsplit, int min_chunk, int* cnt, float* tpart, float* out,           \
        int window, const float* sinks) {                                                       \
        dec_pv<R, KvI8>(scores, ss, pm, pl, v_cache, v_scale, pos_dev, S_cap, Dv, H, G, o_part, \
                        nsplit, min_chunk, cnt, tpart, out, window, sinks);                     \
    }
ATTN_DEC_KERNELS(1)
ATTN_DEC_KERNELS(2)
ATTN_DEC_KERNELS(4)
ATTN_DEC_KERNELS(8)
ATTN_DEC_KERNELS(16)

// ---- decode at short positions: one block per query head, every key, one launch ----
//
// attn_dec_short<KV>  grid (H), DS_THREADS: block h takes all S <= DEC_SHORT_MAX keys of its KV
// head (h / rep) for query head h alone: the scores into shared memory (Dh/8 lanes a key, their
// partial dots summed by a shuffle tree), the block's max and sum exp (block reductions), then
// p = f16(exp(s - M) / L) in place and o = sum_i p_i v_i (Dv/8 lanes a row, row slots summed in
// a fixed order) straight into out: no split partials, no counters, no second launch. The
// blocks of a KV head read its rows from L2 (one of them from DRAM): at short positions the
// split kernels' chain of launches and partial round trips costs more than those reads.
// Rows go out DS_U a lane at a time, the next DS_U in flight while these are used; and
// all S rows of K and V are asked of L2 before the PDL wait (shared out
// over the head's rep blocks). Same roundings as attn_dec_*; deterministic.
#define DS_THREADS 512
#define DEC_SHORT_MAX 2048  // keys attn_dec_short holds (its scores: 8 KiB; attention.py's too)
#define DS_U 4  // rows a lane has in flight (the next DS_U load while these are used)

template <typename KV>
__device__ __forceinline__ void ds_load(typename KV::Chunk (&c)[DS_U], float (&d)[DS_U],
                                        const typename KV::T* __restrict__ base,
                                        const float* __restrict__ scl, i64 row0, int r0, int step,
                                        int S, int D, int col, bool colok) {
#pragma unroll
    for (int u = 0; u < DS_U; ++u) {
        const int r = r0 + u * step;
        const bool ok = colok && r < S;
        c[u] = ok ? *(const typename KV::Chunk*)(base + (i64)r * D + col * 8) : KV::zero();
        d[u] = ok ? KV::scale_at(scl, row0 + r) : 0.0f;
    }
}

// the rows loaded ahead become the current ones (the double buffer's swap)
template <typename KV>
__device__ __forceinline__ void ds_take(typename KV::Chunk (&c)[DS_U], float (&d)[DS_U],
                                        const typename KV::Chunk (&cn)[DS_U],
                                        const float (&dn)[DS_U]) {
#pragma unroll
    for (int u = 0; u < DS_U; ++u) {
        c[u] = cn[u];
        d[u] = dn[u];
    }
}

template <typename KV>
__device__ __forceinline__ void dec_short(const float* __restrict__ q,
                                          const typename KV::T* __restrict__ k_cache,
                                          const float* __restrict__ k_scale,
                                          const typename KV::T* __restrict__ v_cache,
                                          const float* __restrict__ v_scale,
                                          const int* __restrict__ pos_dev, int S_cap, int Dh,
                                          int Dv, int H, int G, float scale,
                                          float* __restrict__ out, int window,
                                          const float* __restrict__ sinks) {
    __shared__ float ps[DEC_SHORT_MAX];
    __shared__ float red[DS_THREADS * 8];  // PV row slots: slots * Dv <= DS_THREADS * 8
    __shared__ float wred[1024 / WARP_SIZE];
    const int h = blockIdx.x, rep = H / G, g = h / rep, tid = threadIdx.x;
    const int end = min(max(pos_dev[0] + 1, 1), S_cap);
    const int lo = window > 0 ? max(0, end - window) : 0;  // a sliding layer's first key
    const int S = min(end - lo, DEC_SHORT_MAX);
    const typename KV::T* kg = k_cache + ((i64)g * S_cap + lo) * Dh;
    const typename KV::T* vg = v_cache + ((i64)g * S_cap + lo) * Dv;
    const i64 row0 = (i64)g * S_cap + lo;
    {  // see dec_enter: the position is old, a prefetch only warms L2
        const int kl = (int)(((i64)S * Dh * (i64)sizeof(typename KV::T) + 127) / 128);
        const int vl = (int)(((i64)S * Dv * (i64)sizeof(typename KV::T) + 127) / 128);
        for (int i = (h % rep) * DS_THREADS + tid; i < kl + vl; i += rep * DS_THREADS)
            PREFETCH_L2(i < kl ? (const char*)kg + (i64)i * 128
                                      : (const char*)vg + (i64)(i - kl) * 128);
    }
    PDL_WAIT();
    PDL_TRIGGER();
    // scores: lpk lanes a key (a power of two >= Dh / 8), kstep keys a block step
    int lpk = 1;
    while (lpk * 8 < Dh) lpk <<= 1;
    const int li = tid % lpk, kstep = DS_THREADS / lpk, kr = tid / lpk;
    const bool kcol = li * 8 < Dh;
    float qv[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) qv[e] = kcol ? q[(i64)h * Dh + li * 8 + e] : 0.0f;
    typename KV::Chunk kc[DS_U];
    float kd[DS_U];
    ds_load<KV>(kc, kd, kg, k_scale, row0, kr, kstep, S, Dh, li, kcol);
    float mloc = NEG_INF;
    for (int base = 0; base < S; base += kstep * DS_U) {  // block-uniform: shuffles below
        typename KV::Chunk kn[DS_U];
        float kdn[DS_U];
        const int nb = base + kstep * DS_U;
        if (nb < S) ds_load<KV>(kn, kdn, kg, k_scale, row0, nb + kr, kstep, S, Dh, li, kcol);
#pragma unroll
        for (int u = 0; u < DS_U; ++u) {
            float kf[8];
            KV::unpack8(kc[u], kf);
            float dot = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) dot += qv[e] * kf[e];
            for (int o = lpk / 2; o > 0; o >>= 1) dot += SHFL_XOR(dot, o);
            const int key = base + kr + u * kstep;
            if (li == 0 && key < S) {
                const float s = KV::scaled(dot, kd[u]) * scale;
                ps[key] = s;
                mloc = fmaxf(mloc, s);
            }
        }
        if (nb < S) ds_take<KV>(kc, kd, kn, kdn);
    }
    // the first V rows go out before the softmax (they do not depend on it)
    const int tpr = Dv / 8, rstep = DS_THREADS / tpr, slot = tid / tpr, d8 = tid % tpr;
    const bool vact = slot < rstep;
    typename KV::Chunk vc[DS_U];
    float vd[DS_U];
    ds_load<KV>(vc, vd, vg, v_scale, row0, slot, rstep, S, Dv, d8, vact);
    float M = block_max_f32(mloc, wred);  // its barriers order the ps stores before
    const float M0 = M;
    float lloc = 0.0f;
    for (int i = tid; i < S; i += DS_THREADS) lloc += expf(ps[i] - M0);
    float L = block_sum_f32(lloc, wred);
    sink_fold(sinks, h, M, L);  // every thread alike
    for (int i = tid; i < S; i += DS_THREADS) ps[i] = round_f16(expf(ps[i] - M) / L);
    __syncthreads();
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    for (int base = 0; base < S; base += rstep * DS_U) {
        typename KV::Chunk vn[DS_U];
        float vdn[DS_U];
        const int nb = base + rstep * DS_U;
        if (nb < S) ds_load<KV>(vn, vdn, vg, v_scale, row0, nb + slot, rstep, S, Dv, d8, vact);
#pragma unroll
        for (int u = 0; u < DS_U; ++u) {
            const int row = base + slot + u * rstep;
            if (vact && row < S) {
                const float pr = KV::scaled(ps[row], vd[u]);  // int8: V's d after the rounding
                float v[8];
                KV::unpack8(vc[u], v);
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[e] += pr * v[e];
            }
        }
        if (nb < S) ds_take<KV>(vc, vd, vn, vdn);
    }
    if (vact) {
#pragma unroll
        for (int e = 0; e < 8; ++e) red[slot * Dv + d8 * 8 + e] = acc[e];
    }
    __syncthreads();
    for (int d = tid; d < Dv; d += DS_THREADS) {
        float o = red[d];
        for (int sl = 1; sl < rstep; ++sl) o += red[sl * Dv + d];
        out[(i64)h * Dv + d] = o;
    }
}

extern "C" __global__ void __launch_bounds__(DS_THREADS)
    attn_dec_short(const float* q, const u16* k_cache, const u16* v_cache, const int* pos_dev,
                   int S_cap, int Dh, int Dv, int H, int G, float scale, float* out, int window,
                   const float* sinks) {
    dec_short<KvF16>(q, k_cache, nullptr, v_cache, nullptr, pos_dev, S_cap, Dh, Dv, H, G, scale,
                     out, window, sinks);
}

extern "C" __global__ void __launch_bounds__(DS_THREADS)
    attn_dec_short_i8(const float* q, const i8* k_cache, const float* k_scale, const i8* v_cache,
                      const float* v_scale, const int* pos_dev, int S_cap, int Dh, int Dv, int H,
                      int G, float scale, float* out, int window, const float* sinks) {
    dec_short<KvI8>(q, k_cache, k_scale, v_cache, v_scale, pos_dev, S_cap, Dh, Dv, H, G, scale,
                    out, window, sinks);
}
