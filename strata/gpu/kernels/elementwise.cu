// Small element-wise kernels of the dense path (qwen2moe's shared expert) and greedy sampling.
#include "common.cuh"

// out = silu(g) * u, written as HostTier does: g / (1 + exp(-g)) * u
extern "C" __global__ void silu_mul(const float* __restrict__ g, const float* __restrict__ u,
                                    float* __restrict__ out, int n) {
    PDL_ENTER();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// y[t, :] *= sigmoid(gl[t]) (qwen2moe's shared-expert gate); gl: [T] gate logits
extern "C" __global__ void sigmoid_scale_rows(float* __restrict__ y, const float* __restrict__ gl,
                                              int D) {
    PDL_ENTER();
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < D) y[(i64)t * D + i] *= 1.0f / (1.0f + expf(-gl[t]));
}

// ids[t] = argmax_v logits[t, v], the lowest index among equal maxima (greedy sampling)
extern "C" __global__ void __launch_bounds__(1024)
    argmax_rows(const float* __restrict__ logits, int V, i32* __restrict__ ids) {
    PDL_ENTER();
    __shared__ float bv[1024 / WARP_SIZE];
    __shared__ int bi[1024 / WARP_SIZE];
    const int t = blockIdx.x, tid = threadIdx.x;
    const int lane = tid % WARP_SIZE, wid = tid / WARP_SIZE, nw = blockDim.x / WARP_SIZE;
    const float* l = logits + (i64)t * V;
    float best = NEG_INF;
    int idx = 0x7fffffff;
    // a thread's values are visited in increasing index order: the first maximum wins
    if (V % 4 == 0 && ((u64)l & 15) == 0) {  // 16-byte chunks, four a thread in flight
        const f32x4* l4 = (const f32x4*)l;
        const int n4 = V / 4;
        for (int c0 = tid; c0 < n4; c0 += 4 * blockDim.x) {
            f32x4 q[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int c = c0 + u * blockDim.x;
                if (c < n4) q[u] = l4[c];
                else q[u].x = q[u].y = q[u].z = q[u].w = NEG_INF;
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int v = 4 * (c0 + u * blockDim.x);
                const float e[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (e[j] > best) {
                        best = e[j];
                        idx = v + j;
                    }
            }
        }
    } else {
        for (int v = tid; v < V; v += blockDim.x)
            if (l[v] > best) {
                best = l[v];
                idx = v;
            }
    }
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        const float ob = SHFL_XOR(best, o);
        const int oi = SHFL_XOR(idx, o);
        if (ob > best || (ob == best && oi < idx)) {
            best = ob;
            idx = oi;
        }
    }
    if (lane == 0) {
        bv[wid] = best;
        bi[wid] = idx;
    }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < nw; ++w)
            if (bv[w] > best || (bv[w] == best && bi[w] < idx)) {
                best = bv[w];
                idx = bi[w];
            }
        ids[t] = idx;
    }
}

// the f16 conversions every kernel uses, exposed for an exhaustive test against NumPy
extern "C" __global__ void f16_convert(const u16* __restrict__ hin, float* __restrict__ fout,
                                       const float* __restrict__ fin, u16* __restrict__ hout,
                                       int n) {
    PDL_ENTER();
    const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        fout[i] = h2f(hin[i]);
        hout[i] = f2h(fin[i]);
    }
}
