// The CPU pool's rows join the card's MoE sum on a hybrid step queued ahead
// (strata/gpu/decode_graph.py): the card runs a whole token's layers without the host launching
// anything, and waits for the host only where a layer's plan sent experts to the pool.
#include "common.cuh"

#if defined(GPU_EMU)
#define BACKOFF() ((void)0)
#elif defined(__HIP__)
#define BACKOFF() __builtin_amdgcn_s_sleep(2)
#else
#define BACKOFF() __nanosleep(100)
#endif

// y = pool + moe (+ sh), x = xb + y: the graph step's order of sums. `stats` is the layer's plan
// (route_car.cu: [2] = picks left to the pool after CAR). With none, the pool's term is +0.0
// (what the host wrote for such a layer before) and the host is not waited for. Otherwise each
// block waits until the host's release counter (pinned host memory, written after the pool's
// rows) reaches this layer's ticket, step * L + layer + 1 (mod 2^32), then reads the rows from
// pinned host memory: volatile loads, after a system-scope fence.
extern "C" __global__ void pool_join(const float* __restrict__ stats, const volatile u32* release,
                                     const i32* __restrict__ step, int n_layer, int layer,
                                     const volatile float* pool, const float* __restrict__ moe,
                                     const float* __restrict__ sh, const float* __restrict__ xb,
                                     float* __restrict__ x, int D) {
    PDL_ENTER();
    const bool wait = stats[2] > 0.0f;
    if (wait) {
        if (threadIdx.x == 0) {
            const u32 ticket = (u32)step[0] * (u32)n_layer + (u32)layer + 1u;
            while ((i32)(release[0] - ticket) < 0) BACKOFF();
            FENCE_SYSTEM();
        }
        __syncthreads();
    }
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D) return;
    float y = (wait ? pool[i] : 0.0f) + moe[i];
    if (sh != nullptr) y += sh[i];
    x[i] = xb[i] + y;
}
