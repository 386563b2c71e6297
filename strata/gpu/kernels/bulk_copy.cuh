// Whole-row copies from global into shared memory for the T = 1 GEMV (gemv.cu gemv1b_*).
//
// On NVIDIA sm_90+ (STRATA_BULK 1) a row is one bulk asynchronous copy (`cp.async.bulk`, the
// TMA's 1-D form: a single instruction moves the whole row, no registers on the way) that
// completes on its own mbarrier; the copies can be issued before the kernel's PDL wait, so the
// bytes are in flight while the kernel before it finishes. Elsewhere (HIP, the emulator, older
// NVIDIA: STRATA_BULK 0) the block copies the rows with 16-byte loads and a barrier.
//
// A row's bytes [g, g + n) travel as their 16-byte-aligned span (the bulk copy wants 16-byte
// aligned addresses and sizes; the span stays inside the allocation, which is 256-aligned and
// rounded up to 512 bytes by CuPy's pool), so in shared memory the row starts at its slot plus
// (g & 15): the same alignment as in global memory, which the decoders' word loads rely on.
#pragma once
#include "common.cuh"

#if !defined(__HIP__) && !defined(STRATA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define STRATA_BULK 1
#else
#define STRATA_BULK 0
#endif

// bytes of a shared-memory slot that holds any row of n bytes at its global alignment (the
// launcher computes the same: strata/gpu/gemv.py bulk_slot_bytes)
__device__ __forceinline__ int bulk_slot_bytes(i64 n) { return (int)((n + 30) / 16 * 16); }

#if STRATA_BULK
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void mbar_init(u64* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}

// make the barriers' initialization visible to the async (copy) proxy
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// one thread: arm `bar` for n bytes and start copying [src, src + n) to dst (both 16-aligned)
__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 n, u64* bar) {
    const u32 b = smem_addr(bar);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(n)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_addr(dst)),
        "l"(src), "r"(n), "r"(b)
        : "memory");
}

// every waiting thread: until the copy on `bar` (its first phase) has landed
__device__ __forceinline__ void mbar_wait0(u64* bar) {
    const u32 b = smem_addr(bar);
    u32 done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, "
            "0, p; }"
            : "=r"(done)
            : "r"(b)
            : "memory");
    }
}
#endif

// Rows rows[0..nr) of n bytes each into slots of `slot` bytes at sm (16-aligned); returns where
// row m's first byte lands via row_at(sm, slot, rows[m], m). Bulk: thread 0 initializes nr
// barriers and issues the copies (call before the PDL wait), the others pass; the readers call
// bulk_rows_wait(bars, m) before touching row m. Fallback: the whole block copies (call after
// the wait), then one __syncthreads; bulk_rows_wait is a no-op.
__device__ __forceinline__ const u8* row_at(const u8* sm, int slot, const u8* g, int m) {
    return sm + (i64)m * slot + ((u64)g & 15u);
}

__device__ __forceinline__ void bulk_rows_issue(u8* sm, int slot, u64* bars, const u8* W,
                                                i64 row_bytes, int r0, int nr) {
#if STRATA_BULK
    if (threadIdx.x == 0) {
        for (int m = 0; m < nr; ++m) mbar_init(&bars[m]);
        mbar_init_fence();
        for (int m = 0; m < nr; ++m) {
            const u8* g = W + (i64)(r0 + m) * row_bytes;
            const u8* a = (const u8*)((u64)g & ~(u64)15);
            const u32 n = (u32)(((u64)g + row_bytes + 15 - (u64)a) & ~(u64)15);
            bulk_load(sm + (i64)m * slot, a, n, &bars[m]);
        }
    }
    __syncthreads();  // the barriers' init is seen by every waiting thread
#else
    (void)sm, (void)slot, (void)bars, (void)W, (void)row_bytes, (void)r0, (void)nr;
#endif
}

__device__ __forceinline__ void bulk_rows_fallback(u8* sm, int slot, const u8* W, i64 row_bytes,
                                                   int r0, int nr) {
#if !STRATA_BULK
    for (int m = 0; m < nr; ++m) {
        const u8* g = W + (i64)(r0 + m) * row_bytes;
        const i32x4* a = (const i32x4*)((u64)g & ~(u64)15);
        const int nv = (int)((((u64)g & 15u) + row_bytes + 15) >> 4);
        i32x4* d = (i32x4*)(sm + (i64)m * slot);
        for (int i = threadIdx.x; i < nv; i += blockDim.x) d[i] = a[i];
    }
    __syncthreads();
#else
    (void)sm, (void)slot, (void)W, (void)row_bytes, (void)r0, (void)nr;
#endif
}

__device__ __forceinline__ void bulk_rows_wait(u64* bars, int m) {
#if STRATA_BULK
    mbar_wait0(&bars[m]);
#else
    (void)bars, (void)m;
#endif
}
