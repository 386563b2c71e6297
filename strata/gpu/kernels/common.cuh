// Shared by every Strata kernel: integer types, warp primitives, f16/bf16 conversions, dp4a.
// One source for CUDA (NVRTC) and HIP (hipRTC/hipcc): no vendor header is included, and every
// vendor intrinsic sits behind a guard with a portable fallback. WARP_SIZE (the device's warp
// size: 32 on NVIDIA and RDNA, 64 on CDNA) is passed by the launcher as -DWARP_SIZE=N.
#pragma once
#ifndef WARP_SIZE
#define WARP_SIZE 32
#endif

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;
struct alignas(16) i32x4 {
    int x, y, z, w;
};
struct alignas(16) f32x4 {
    float x, y, z, w;
};

#define NEG_INF (-__int_as_float(0x7f800000))  // -inf without <cmath>

// ---- programmatic dependent launch (strata/gpu/pdl.py): the first statement of every kernel.
// Wait for the kernel before this one in the stream (a no-op when launched without PDL), then let
// the next one's blocks in. Nothing may run before the wait: a kernel that returned before it
// could complete ahead of its predecessor and break the chain's order.
#if !defined(__HIP__) && !defined(GPU_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ENTER() \
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#define PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#define PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" ::"l"(p))
#else
#define PDL_ENTER() ((void)0)
#define PDL_WAIT() ((void)0)
#define PDL_TRIGGER() ((void)0)
#define PREFETCH_L2(p) ((void)(p))
#endif
// The split form, for a kernel whose weights do not depend on its predecessor (the T = 1 GEMVs,
// gemv.cu): it asks L2 for its weight rows (PREFETCH_L2), PDL_WAIT()s, and lets the
// next kernel in (PDL_TRIGGER()) either at once or only after its main loop, so that a
// large grid's successor does not squat on the SMs while its own blocks are still reading (which
// the launcher picks: gemv.py pdl_early). Every thread still waits before any store or return.

// ---- a system-scope fence: this thread's writes (to pinned host memory too) are visible to the
// host before its later ones; the host-device handshakes of a step queued ahead (route_car.cu,
// pool_join.cu). The emulator runs a kernel to its end at launch: nothing to order against.
#if defined(GPU_EMU)
#define FENCE_SYSTEM() ((void)0)
#else
#define FENCE_SYSTEM() __threadfence_system()
#endif

// ---- the last of n blocks at a counter: `block_arrive_last(cnt, n, flag)` is true in every
// thread of the block that is the n-th to add 1 to *cnt; the global writes of every arriving
// block's threads before the call are visible to the last block's reads after it (reads that skip
// L1: ld.cg or volatile). Every thread of the block calls it; `flag` is a __shared__ int.
// CUDA (sm_70+): bar.sync, one atom.add.acq_rel.gpu by thread 0 (its release cumulative over the
// block's writes ordered before it by the barrier, its acquire over the earlier arrivals' through
// the counter's chain of read-modify-writes), bar.sync: CUTLASS's semaphore pattern, without the
// two sequentially consistent fences (fence.sc.gpu) of the portable form. HIP and the emulator:
// __threadfence(), a relaxed atomicAdd, __threadfence().
__device__ __forceinline__ bool block_arrive_last(int* cnt, int n, int& flag) {
#if !defined(__HIP__) && !defined(GPU_EMU) && defined(__CUDA_ARCH__)
    __syncthreads();
    if (threadIdx.x == 0) {
        int old;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;"
                     : "=r"(old)
                     : "l"(cnt)
                     : "memory");
        flag = old == n - 1;
    }
    __syncthreads();
    return flag != 0;
#else
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) flag = atomicAdd(cnt, 1) == n - 1;
    __syncthreads();
    const bool last = flag != 0;
    if (last) __threadfence();
    return last;
#endif
}

// ---- warp shuffles (full warp; `width` keeps CDNA's wave64 honest) ----
#if defined(GPU_EMU)
#define SHFL_XOR(v, m) emu::shfl_xor((v), (m))
#elif defined(__HIP__)
#define SHFL_XOR(v, m) __shfl_xor((v), (m), WARP_SIZE)
#else
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), WARP_SIZE)
#endif

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += SHFL_XOR(v, o);
    return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        T w = SHFL_XOR(v, o);
        v = w > v ? w : v;
    }
    return v;
}

// Block-wide sum of a double (blockDim.x a multiple of WARP_SIZE, <= 1024); every thread
// gets the total. `scratch` is caller-provided shared memory of 1024 / WARP_SIZE doubles.
__device__ __forceinline__ double block_sum_f64(double v, double* scratch) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int nw = blockDim.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    // every warp sums the partials by the same shuffle tree (fixed order: deterministic)
    return warp_sum(lane < nw ? scratch[lane] : 0.0);
}

__device__ __forceinline__ float block_max_f32(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int nw = blockDim.x / WARP_SIZE;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    float t = scratch[0];
    for (int w = 1; w < nw; ++w) t = scratch[w] > t ? scratch[w] : t;
    return t;
}

__device__ __forceinline__ float block_sum_f32(float v, float* scratch) {
    const int lane = threadIdx.x % WARP_SIZE, wid = threadIdx.x / WARP_SIZE;
    const int nw = blockDim.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < nw; ++w) t += scratch[w];
    return t;
}

// ---- f16 / bf16 (IEEE round to nearest even, as F16C and numpy do) ----
// The hardware conversion where there is one (CUDA: cvt; HIP: _Float16); the bit-exact software
// version elsewhere (the CPU emulation) and as the reference the others are tested against.
__device__ __forceinline__ float h2f_soft(u16 h) {
    const u32 s = (u32)(h & 0x8000u) << 16;
    const u32 e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float f = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
        return s ? -f : f;
    }
    if (e == 31) return __uint_as_float(s | 0x7f800000u | (m << 13));
    return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ u16 f2h_soft(float f) {
    const u32 x = __float_as_uint(f);
    const u32 s = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return (u16)(s | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x477ff000u) return (u16)(s | 0x7c00u);  // rounds past 65504: inf
    if (a < 0x38800000u) {                            // below 2^-14: subnormal or zero
        const u32 m = (u32)__float2int_rn(__uint_as_float(a) * 16777216.0f);  // |f| / 2^-24
        return (u16)(s | m);
    }
    u32 r = a - 0x38000000u;  // rebias the exponent by 112
    r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
    return (u16)(s | r);
}

#if defined(__HIP__)
__device__ __forceinline__ float h2f(u16 h) {
    _Float16 v;
    __builtin_memcpy(&v, &h, 2);
    return (float)v;
}
__device__ __forceinline__ u16 f2h(float f) {
    const _Float16 v = (_Float16)f;
    u16 h;
    __builtin_memcpy(&h, &v, 2);
    return h;
}
#elif defined(__CUDA_ARCH__) && !defined(GPU_EMU)
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
__device__ __forceinline__ float h2f(u16 h) { return h2f_soft(h); }
__device__ __forceinline__ u16 f2h(float f) { return f2h_soft(f); }
#endif

__device__ __forceinline__ float round_f16(float f) { return h2f(f2h(f)); }

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float((u32)b << 16); }

__device__ __forceinline__ float round_bf16(float f) {  // GGML_FP32_TO_BF16, then back
    const u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(((u >> 16) | 64u) << 16);
    return __uint_as_float(((u + (0x7fffu + ((u >> 16) & 1u))) >> 16) << 16);
}

// ---- unaligned-safe loads: GGML blocks are only 2-byte aligned ----
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) {
    const u16* q = (const u16*)p;
    return (u32)q[0] | ((u32)q[1] << 16);
}
__device__ __forceinline__ u16 ld_u16(const u8* p) { return *(const u16*)p; }

// 16 (8) bytes at p as four (two) words with one 128-bit (64-bit) load: p must be 16- (8-)
// byte aligned. Q4_K / Q5_K blocks (144 / 176 bytes) are 16-byte aligned and IQ4_XS blocks (136)
// 8-byte aligned in every row that starts so; their decoders check the block's address and
// fall back to 2-byte loads (ncu at attn_q: Q4_K's sixteen 16-bit loads a sub-block queued on
// the LSU).
// N consecutive words at a 2-byte aligned p from N + 1 aligned 4-byte loads (2N 16-bit loads
// otherwise): words of p & ~3, each pair funnel-shifted by p's offset (0 or 16 bits). Where p is
// 4-byte aligned the extra load re-reads the last word, so nothing past p + 4N is touched.
template <int N>
__device__ __forceinline__ void ld_words_a2(const u8* p, u32* w) {
    const int off = (int)((u64)p & 3);  // 0 or 2
    const u32* a = (const u32*)(p - off);
    u32 v[N + 1];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = a[k];
    v[N] = a[off ? N : N - 1];
#pragma unroll
    for (int k = 0; k < N; ++k) w[k] = (u32)((((u64)v[k + 1] << 32) | v[k]) >> (8 * off));
}

// ... and at any byte p (MXFP4's 17-byte blocks): the aligned words holding [p, p + 4N), each
// pair shifted by p's offset (0-3 bytes); nothing outside those words is read
template <int N>
__device__ __forceinline__ void ld_words_a1(const u8* p, u32* w) {
    const int off = (int)((u64)p & 3);
    const u32* a = (const u32*)(p - off);
    u32 v[N + 1];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = a[k];
    v[N] = a[off ? N : N - 1];
#pragma unroll
    for (int k = 0; k < N; ++k) w[k] = (u32)((((u64)v[k + 1] << 32) | v[k]) >> (8 * off));
}

__device__ __forceinline__ void ld_w4_a16(const u8* p, u32* w) {
    const uint4 v = *(const uint4*)p;
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}
__device__ __forceinline__ void ld_w2_a8(const u8* p, u32* w) {
    const uint2 v = *(const uint2*)p;
    w[0] = v.x, w[1] = v.y;
}

// ---- int8 x4 dot product with accumulate ----
__device__ __forceinline__ int dot4(int a, int b, int c) {
#if defined(__HIP__) && (defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__))
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#elif !defined(__HIP__) && !defined(GPU_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#else
    return c + (int)(i8)(a) * (int)(i8)(b) + (int)(i8)(a >> 8) * (int)(i8)(b >> 8) +
           (int)(i8)(a >> 16) * (int)(i8)(b >> 16) + (int)(i8)(a >> 24) * (int)(i8)(b >> 24);
#endif
}

// the four bytes of w as int8 sum (for Q4_K/Q5_K mins: sum of the activation quants)
__device__ __forceinline__ int sum4(int a, int c) { return dot4(a, 0x01010101, c); }
