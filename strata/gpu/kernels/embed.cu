// Embedding gather: x[t] = dequant(token_embd[ids[t]]), bit-identical to gguf.quants.
// Quantized tables: one thread per 32-element sub-block; float tables: one thread per element.
#include "quant_blocks.cuh"

template <int QT>
__device__ __forceinline__ void embed_q(const u8* __restrict__ E, const i32* __restrict__ ids,
                                        int D, float* __restrict__ out) {
    const int t = blockIdx.y;
    const int sb = blockIdx.x * blockDim.x + threadIdx.x;
    if (sb >= D / 32) return;
    const int spb = Fmt<QT>::QK / 32;
    const u8* row = E + (i64)ids[t] * (D / Fmt<QT>::QK) * Fmt<QT>::BB;
    float v[32];
    deq32<QT>(row + (i64)(sb / spb) * Fmt<QT>::BB, sb % spb, v);
    float* o = out + (i64)t * D + sb * 32;
#pragma unroll
    for (int i = 0; i < 32; ++i) o[i] = v[i];
}

#define EMBED_Q_KERNEL(name, QT)                                                               \
    extern "C" __global__ void embed_##name(const u8* E, const i32* ids, int D, float* out) {  \
        PDL_ENTER();                                                                           \
        embed_q<QT>(E, ids, D, out);                                                           \
    }
QFORMATS(EMBED_Q_KERNEL)

extern "C" __global__ void embed_float(const u8* __restrict__ E, const i32* __restrict__ ids,
                                       int D, int qt, float* __restrict__ out) {
    PDL_ENTER();
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= D) return;
    const i64 r = ids[t];
    float v;
    if (qt == QT_F32)
        v = ((const float*)E)[r * D + i];
    else if (qt == QT_F16)
        v = h2f(((const u16*)E)[r * D + i]);
    else
        v = bf2f(((const u16*)E)[r * D + i]);
    out[(i64)t * D + i] = v;
}
