// A prompt chunk's (token, expert) pairs grouped by expert on the card: the tiles the grouped
// expert kernels take (experts_grouped.cu, experts_mma.cu), from the router's picks still on the
// device, so that the host neither reads the picks back nor waits for them (the host's
// pairs_fast.group_pairs_into, which sorts by slot, stays for the picks it holds).
//   ids [P] (pair p = t * K + k; < 0 or >= E: no pick), slot_row [E] (the layer's expert ->
//   slot, < 0: not resident) -> pair_slot [P] = slot_row[ids] (-1 where none), order: the pairs
//   with a slot, stably sorted by expert id; tiles of up to nt pairs of one expert: tile_slot,
//   tile_first (into order), tile_n; n_tiles [1]; hist [E] += each expert's pairs (optional).
// One block of GP_THREADS threads, E <= GP_THREADS. Phases: per-(warp, expert) counts of the
// warp's contiguous segment of pairs; per expert its count and tiles, exclusive scans over the
// experts (Hillis-Steele in shared memory), the warps' bases within an expert's run; then each
// warp walks its segment WARP_SIZE pairs at a time and places a pair at its base plus its rank
// among the group's earlier pairs of the same expert (from shared memory: no atomics in the
// order, so the result is the same on every run and on the host reference).
#include "common.cuh"

#define GP_THREADS 512
#define GP_WARPS (GP_THREADS / WARP_SIZE)

extern "C" __global__ void __launch_bounds__(GP_THREADS)
    group_pairs(const i32* __restrict__ ids, int P, const i32* __restrict__ slot_row, int E,
                int nt, i32* __restrict__ pair_slot, i32* __restrict__ order,
                i32* __restrict__ tile_slot, i32* __restrict__ tile_first,
                i32* __restrict__ tile_n, i32* __restrict__ n_tiles, i32* __restrict__ hist) {
    PDL_ENTER();
    __shared__ int base[GP_WARPS * GP_THREADS];  // [warp][expert]: counts, then bases
    __shared__ int start[GP_THREADS], tstart[GP_THREADS];
    __shared__ int grp[GP_THREADS];
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, w = tid / WARP_SIZE;
    // pairs a warp: whole groups of WARP_SIZE, so that every warp runs as many groups
    const int seg = ((P + GP_WARPS - 1) / GP_WARPS + WARP_SIZE - 1) / WARP_SIZE * WARP_SIZE;
    const int p0 = w * seg, p1 = min(P, p0 + seg);
    for (int i = tid; i < GP_WARPS * E; i += GP_THREADS) base[i] = 0;
    __syncthreads();
    for (int p = p0 + lane; p < p1; p += WARP_SIZE) {
        const int e = ids[p];
        const int s = e >= 0 && e < E ? slot_row[e] : -1;
        pair_slot[p] = s;
        if (s >= 0) atomicAdd(&base[w * E + e], 1);
    }
    __syncthreads();
    int cnt = 0, nti = 0;
    if (tid < E) {
        for (int v = 0; v < GP_WARPS; ++v) cnt += base[v * E + tid];
        nti = (cnt + nt - 1) / nt;
        start[tid] = cnt;
        tstart[tid] = nti;
    }
    __syncthreads();
    for (int off = 1; off < E; off <<= 1) {  // inclusive scans of the counts and the tiles
        int a = 0, b = 0;
        if (tid < E && tid >= off) {
            a = start[tid - off];
            b = tstart[tid - off];
        }
        __syncthreads();
        if (tid < E) {
            start[tid] += a;
            tstart[tid] += b;
        }
        __syncthreads();
    }
    if (tid < E) {
        const int s0 = start[tid] - cnt, t0 = tstart[tid] - nti;
        int run = s0;
        for (int v = 0; v < GP_WARPS; ++v) {
            const int n = base[v * E + tid];
            base[v * E + tid] = run;
            run += n;
        }
        const int slot = slot_row[tid];
        for (int j = 0; j < nti; ++j) {
            tile_slot[t0 + j] = slot;
            tile_first[t0 + j] = s0 + j * nt;
            tile_n[t0 + j] = min(nt, cnt - j * nt);
        }
        if (hist) hist[tid] += cnt;
        if (tid == E - 1) n_tiles[0] = tstart[tid];
    }
    __syncthreads();
    for (int g0 = 0; g0 < seg; g0 += WARP_SIZE) {  // the same count of groups in every warp
        const int p = p0 + g0 + lane;
        int e = -1;
        if (p < p1) {
            e = ids[p];
            if (!(e >= 0 && e < E && slot_row[e] >= 0)) e = -1;
        }
        grp[tid] = e;
        __syncthreads();
        int at = 0, rank = 0, tot = 0;
        if (e >= 0) {
            for (int j = 0; j < WARP_SIZE; ++j) {
                const int same = grp[w * WARP_SIZE + j] == e;
                rank += j < lane && same;
                tot += same;
            }
            at = base[w * E + e] + rank;
        }
        __syncthreads();  // every lane has read its base before the last of its expert moves it
        if (e >= 0) {
            order[at] = p;
            if (rank == tot - 1) base[w * E + e] += tot;
        }
        __syncthreads();
    }
}
