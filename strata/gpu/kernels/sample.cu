// Sampling on the card: llama.cpp's chain (top-k -> softmax -> top-p -> min-p -> temperature ->
// draw) on one logits row [V], with a uniform u in [0, 1) from the host's seeded generator; only
// the token id leaves the card. The math is strata/gpu/sample.py's `sample_ref`, step for step:
//
//   rank order   logit descending, lower index first on ties (-0 ranks with +0)
//   top-k        the first k of rank order (k = 0 or k >= V: all), found by a radix select
//   softmax      e_i = exp(z_i - z_max) in double, held as q_i = floor(e_i * 2^40 + 0.5) (u64):
//                integer sums do not depend on the order they are added in, so every sum here
//                and in the reference is the same number whatever the thread layout
//   top-p        the shortest rank prefix of the top-k whose mass sum q reaches
//                T = min(ceil(top_p * S), S), S = the top-k's mass (a radix select on mass)
//   min-p        keep q_i >= min_p * 2^40 (p_i >= min_p * p_max)
//   temperature  r_i = floor(exp((z_i - z_max) / temp) * 2^40 + 0.5) over what is kept
//   draw         t = min(floor(u * W), W - 1), W = sum r; the first index (vocabulary order) whose
//                running sum of r exceeds t
//
// temp <= 0 gives the greedy token. Host and device differ only where the libm and device exp
// differ by an ulp and that moves a fixed-point value across a cut (about 1e-12 of the mass).
// V < 2^23 keeps every sum in u64; NaN logits are not supported. One block of SAMPLE_THREADS
// threads, about a dozen passes over the row (L2-resident); `work` [V] u64 holds q between
// passes, so nothing is allocated and the one read-back is the id.
#include "common.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_NWARP (SAMPLE_THREADS / WARP_SIZE)
#define FIX_SCALE 1099511627776.0  // 2^40
#define HIST_COPIES 16  // copies of the radix histogram: lanes of a warp rarely share an address

#if defined(GPU_EMU)
#define SHFL_IDX(v, src) emu::shfl((v), (src))
#elif defined(__HIP__)
#define SHFL_IDX(v, src) __shfl((v), (src), WARP_SIZE)
#else
#define SHFL_IDX(v, src) __shfl_sync(0xffffffffu, (v), (src), WARP_SIZE)
#endif

// float -> u32 whose unsigned order is the float order; -0 maps to +0's key
__device__ __forceinline__ u32 order_key(float f) {
    u32 b = __float_as_uint(f);
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_float(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ u64 fixq(double e) { return (u64)(e * FIX_SCALE + 0.5); }

// exp((z - m) / t), exactly 1 where z == m (also for infinite m)
__device__ __forceinline__ double rel_exp(float z, float m, double t) {
    if (z == m) return 1.0;
    return exp(((double)z - (double)m) / t);
}

// A rank prefix: key > tau, or key == tau at index <= last (ties: lower indices first).
struct Cut {
    u32 tau;
    int last;
    __device__ bool has(u32 k, int i) const { return k > tau || (k == tau && i <= last); }
};

struct Shared {
    u64 hist[256 * HIST_COPIES];  // [digit, copy]
    u64 part[SAMPLE_NWARP];
    u64 r64;
    u32 r32;
    int ri;
};

__device__ __forceinline__ u64 block_sum_u64(u64 v, Shared& sh) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();  // part may still be read by a previous call
    if (lane == 0) sh.part[wid] = v;
    __syncthreads();
    u64 t = 0;
    for (int w = 0; w < SAMPLE_NWARP; ++w) t += sh.part[w];
    return t;
}

__device__ __forceinline__ u32 block_max_u32(u32 v, Shared& sh) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh.part[wid] = v;
    __syncthreads();
    u32 t = 0;
    for (int w = 0; w < SAMPLE_NWARP; ++w) t = (u32)sh.part[w] > t ? (u32)sh.part[w] : t;
    return t;
}

// The key tau of the rank-order element where the running measure mu(i, key) first reaches
// `target` (1 <= target <= the total), and the measure strictly above tau. 8-bit digits, most
// significant first. Logits crowd a few digits, so a thread adds runs of equal digits before a
// shared atomic into its lane's copy of the histogram (threadIdx % HIST_COPIES), and the copies
// are summed after: integer atomics, so the histogram does not depend on their order.
template <class M>
__device__ void radix_select(const float* __restrict__ z, int V, u64 target, const M& mu,
                             Shared& sh, u32* tau, u64* above) {
    u32 prefix = 0;
    u64 acc_above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        const u32 hmask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
        for (int b = threadIdx.x; b < 256 * HIST_COPIES; b += blockDim.x) sh.hist[b] = 0;
        __syncthreads();
        const int copy = threadIdx.x % HIST_COPIES;
        int cur = -1;
        u64 run = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const u32 k = order_key(z[i]);
            if ((k & hmask) != prefix) continue;
            const u64 m = mu(i, k);
            if (m == 0) continue;
            const int d = (int)((k >> shift) & 255u);
            if (d != cur) {
                if (cur >= 0) atomicAdd(&sh.hist[cur * HIST_COPIES + copy], run);
                cur = d;
                run = 0;
            }
            run += m;
        }
        if (cur >= 0) atomicAdd(&sh.hist[cur * HIST_COPIES + copy], run);
        __syncthreads();
        for (int b = threadIdx.x; b < 256; b += blockDim.x) {  // copies -> copy 0
            u64 t = 0;
            for (int c = 0; c < HIST_COPIES; ++c) t += sh.hist[b * HIST_COPIES + c];
            sh.hist[b * HIST_COPIES] = t;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u64 a = acc_above;
            int d = 255;
            for (; d > 0; --d) {  // the first digit (from the top) whose bucket reaches target
                const u64 h = sh.hist[d * HIST_COPIES];
                if (a + h >= target) break;
                a += h;
            }
            sh.r64 = a;
            sh.r32 = prefix | ((u32)d << shift);
        }
        __syncthreads();
        prefix = sh.r32;
        acc_above = sh.r64;
        __syncthreads();  // sh.r* are rewritten by the next digit
    }
    *tau = prefix;
    *above = acc_above;
}

// The first index i (vocabulary order) where sum_{j <= i} mu(j, key_j) >= need (need >= 1, at
// most the total). Each warp sums a contiguous segment; the warp whose segment holds the
// crossing walks it WARP_SIZE elements at a time.
template <class M>
__device__ int locate(const float* __restrict__ z, int V, u64 need, const M& mu, Shared& sh) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    int seg = (V + SAMPLE_NWARP - 1) / SAMPLE_NWARP;
    seg = (seg + WARP_SIZE - 1) / WARP_SIZE * WARP_SIZE;
    const int lo = wid * seg, hi = min(V, lo + seg);
    u64 s = 0;
    for (int i = lo + lane; i < hi; i += WARP_SIZE) s += mu(i, order_key(z[i]));
    s = warp_sum(s);
    __syncthreads();
    if (lane == 0) sh.part[wid] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 a = 0;
        int w = 0;
        for (; w < SAMPLE_NWARP - 1; ++w) {
            if (a + sh.part[w] >= need) break;
            a += sh.part[w];
        }
        sh.r32 = (u32)w;
        sh.r64 = need - a;
    }
    __syncthreads();
    if (wid == (int)sh.r32) {  // warp-uniform from here on
        u64 rem = sh.r64;
        for (int base = lo; base < hi; base += WARP_SIZE) {
            const int i = base + lane;
            const u64 m = i < hi ? mu(i, order_key(z[i])) : 0;
            const u64 t = warp_sum(m);
            if (t >= rem) {
                u64 run = 0;
                int j = 0;
                for (; j < WARP_SIZE - 1; ++j) {
                    run += SHFL_IDX(m, j);
                    if (run >= rem) break;
                }
                if (lane == 0) sh.ri = base + j;
                break;
            }
            rem -= t;
        }
    }
    __syncthreads();
    const int r = sh.ri;
    __syncthreads();
    return r;
}

struct CountAll {
    __device__ u64 operator()(int, u32) const { return 1; }
};
struct CountKey {  // the ties at one key
    u32 tau;
    __device__ u64 operator()(int, u32 k) const { return k == tau ? 1 : 0; }
};
struct Mass {  // q of the top-k candidates (0 elsewhere)
    const u64* q;
    __device__ u64 operator()(int i, u32) const { return q[i]; }
};
struct MassKey {
    const u64* q;
    u32 tau;
    __device__ u64 operator()(int i, u32 k) const { return k == tau ? q[i] : 0; }
};
struct DrawWeight {  // r_i over the kept set (greedy: the top key only)
    const float* z;
    const u64* q;
    Cut ck, cp;
    double min_q, temp;
    float m;
    u32 kmax;
    __device__ u64 operator()(int i, u32 k) const {
        if (temp <= 0.0) return k == kmax ? 1 : 0;
        if (!ck.has(k, i) || !cp.has(k, i) || (double)q[i] < min_q) return 0;
        return fixq(rel_exp(z[i], m, temp));
    }
};

// prm: [top_k, top_p, min_p, temperature, u] (doubles); out[0] = the sampled token id
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_row(const float* __restrict__ z, int V, const double* __restrict__ prm,
               u64* work, i32* __restrict__ out) {
    PDL_ENTER();
    __shared__ Shared sh;
    const int top_k = (int)prm[0];
    const double top_p = prm[1], min_p = prm[2], temp = prm[3], u = prm[4];

    u32 kmax = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) kmax = max(kmax, order_key(z[i]));
    kmax = block_max_u32(kmax, sh);
    const float m = key_float(kmax);

    // top-k: the k-th element of rank order (ties at its key: the lower indices)
    Cut ck = {0u, 0x7fffffff};
    if (temp > 0.0 && top_k > 0 && top_k < V) {
        u64 above;
        radix_select(z, V, (u64)top_k, CountAll{}, sh, &ck.tau, &above);
        ck.last = locate(z, V, (u64)top_k - above, CountKey{ck.tau}, sh);
    }

    // softmax over the candidates, in fixed point relative to the top one
    Cut cp = ck;
    if (temp > 0.0) {
        u64 s = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float zi = z[i];
            const u64 q = ck.has(order_key(zi), i) ? fixq(rel_exp(zi, m, 1.0)) : 0;
            work[i] = q;
            s += q;
        }
        s = block_sum_u64(s, sh);  // its barriers also order the work writes before the reads

        // top-p: the shortest rank prefix whose mass reaches T
        if (top_p < 1.0) {
            u64 t = (u64)ceil(top_p * (double)s);
            t = t > s ? s : t;
            t = t < 1 ? 1 : t;
            u64 above;
            radix_select(z, V, t, Mass{work}, sh, &cp.tau, &above);
            cp.last = locate(z, V, t - above, MassKey{work, cp.tau}, sh);
        }
    }

    // min-p, temperature and the draw (greedy when temp <= 0)
    const DrawWeight dw = {z, work, ck, cp, min_p * FIX_SCALE, temp, m, kmax};
    u64 w = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) w += dw(i, order_key(z[i]));
    w = block_sum_u64(w, sh);
    u64 t = temp > 0.0 ? (u64)floor(u * (double)w) : 0;
    t = t >= w ? w - 1 : t;
    const int tok = locate(z, V, t + 1, dw, sh);
    if (threadIdx.x == 0) out[0] = tok;
}
