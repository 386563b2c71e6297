// CPU emulation of the small CUDA subset Strata's kernels use: one block at a time, each CUDA
// thread a ucontext fiber; __syncthreads / warp ops are cooperative barriers (deadlock = abort).
#pragma once
#include <ucontext.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include <algorithm>
#define GPU_EMU 1
struct uint3 { unsigned x, y, z; };
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
namespace emu {
enum { RUN = 0, WBLOCK = 1, WWARP = 2, DONE = 3 };
struct Fiber { ucontext_t ctx; uint3 tid; int lin; int state; };
inline int warp_size() { return EMU_WARP; }
struct Rt {
  ucontext_t sched;
  std::vector<Fiber> f;
  std::vector<char*> stacks;
  Fiber* cur = nullptr;
  uint3 bid; dim3 bdim, gdim;
  std::function<void()> body;
  std::vector<uint64_t> xbuf;
  long long switches = 0;
};
inline Rt& rt() { static Rt r; return r; }
inline void entry() { rt().body(); rt().cur->state = DONE; swapcontext(&rt().cur->ctx, &rt().sched); }
inline void yield_(int st) { Fiber* c = rt().cur; c->state = st; rt().switches++; swapcontext(&c->ctx, &rt().sched); }
inline void sync_block() { yield_(WBLOCK); }
inline void sync_warp() { yield_(WWARP); }
template <class T> inline T shfl_xor(T v, int m) {
  Rt& r = rt(); int lin = r.cur->lin; int W = EMU_WARP; int base = lin - lin % W; int lane = lin % W;
  uint64_t b = 0; memcpy(&b, &v, sizeof(T)); r.xbuf[lin] = b; sync_warp();
  int src = lane ^ m; T out; uint64_t o = r.xbuf[base + (src < W ? src : lane)]; memcpy(&out, &o, sizeof(T)); sync_warp();
  return out;
}
template <class T> inline T shfl(T v, int s) {
  Rt& r = rt(); int lin = r.cur->lin; int W = EMU_WARP; int base = lin - lin % W;
  uint64_t b = 0; memcpy(&b, &v, sizeof(T)); r.xbuf[lin] = b; sync_warp();
  T out; uint64_t o = r.xbuf[base + (s % W)]; memcpy(&out, &o, sizeof(T)); sync_warp();
  return out;
}
inline int launch(dim3 g, dim3 b, std::function<void()> body) {
  Rt& r = rt();
  int n = b.x * b.y * b.z;
  if (n % EMU_WARP) { fprintf(stderr, "emu: block of %d threads is not whole warps\n", n); return 2; }
  const size_t SS = 256 * 1024;
  while ((int)r.stacks.size() < n) r.stacks.push_back((char*)malloc(SS));
  r.f.resize(n); r.xbuf.assign(n, 0); r.body = body; r.gdim = g; r.bdim = b;
  for (unsigned bz = 0; bz < g.z; bz++) for (unsigned by = 0; by < g.y; by++) for (unsigned bx = 0; bx < g.x; bx++) {
    r.bid = {bx, by, bz};
    for (int i = 0; i < n; i++) {
      Fiber& fb = r.f[i]; fb.lin = i; fb.state = RUN;
      fb.tid = {(unsigned)(i % b.x), (unsigned)((i / b.x) % b.y), (unsigned)(i / (b.x * b.y))};
      getcontext(&fb.ctx); fb.ctx.uc_stack.ss_sp = r.stacks[i]; fb.ctx.uc_stack.ss_size = SS; fb.ctx.uc_link = nullptr;
      makecontext(&fb.ctx, (void (*)())entry, 0);
    }
    for (;;) {
      bool ran = false;
      for (int i = 0; i < n; i++) if (r.f[i].state == RUN) { r.cur = &r.f[i]; ran = true; swapcontext(&r.sched, &r.f[i].ctx); }
      int live = 0, wb = 0; for (int i = 0; i < n; i++) { if (r.f[i].state != DONE) live++; if (r.f[i].state == WBLOCK) wb++; }
      if (!live) break;
      bool rel = false;
      if (wb == live) { for (int i = 0; i < n; i++) if (r.f[i].state == WBLOCK) r.f[i].state = RUN; rel = true; }
      else for (int w = 0; w < n / EMU_WARP; w++) {
        int l = 0, ww = 0; for (int i = w * EMU_WARP; i < (w + 1) * EMU_WARP; i++) { if (r.f[i].state != DONE) l++; if (r.f[i].state == WWARP) ww++; }
        if (l && ww == l) { for (int i = w * EMU_WARP; i < (w + 1) * EMU_WARP; i++) if (r.f[i].state == WWARP) r.f[i].state = RUN; rel = true; }
      }
      if (!rel && !ran) {
        fprintf(stderr, "emu: DEADLOCK in block (%u,%u,%u): live %d, at __syncthreads %d\n", bx, by, bz, live, wb);
        for (int w = 0; w < n / EMU_WARP; w++) { fprintf(stderr, " warp %d:", w); for (int i = w*EMU_WARP; i < (w+1)*EMU_WARP; i++) fprintf(stderr, "%d", r.f[i].state); fprintf(stderr, "\n"); }
        return 3;
      }
      if (!rel) { /* fibers ran and stopped at partial barriers: loop again */
        bool any = false; for (int i = 0; i < n; i++) if (r.f[i].state == RUN) any = true;
        if (!any) { fprintf(stderr, "emu: DEADLOCK (mixed barriers) in block (%u,%u,%u)\n", bx, by, bz);
          for (int w = 0; w < n / EMU_WARP; w++) { fprintf(stderr, " warp %d:", w); for (int i = w*EMU_WARP; i < (w+1)*EMU_WARP; i++) fprintf(stderr, "%d", r.f[i].state); fprintf(stderr, "\n"); }
          return 3; }
      }
    }
  }
  return 0;
}
}  // namespace emu
#define threadIdx (emu::rt().cur->tid)
#define blockIdx (emu::rt().bid)
#define blockDim (emu::rt().bdim)
#define gridDim (emu::rt().gdim)
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static
#define __launch_bounds__(...)
#define __syncthreads() emu::sync_block()
#define __syncwarp() emu::sync_warp()
inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
inline int __float2int_rz(float x) { return (int)x; }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline int atomicAdd(int* p, int v) { int o = *p; *p += v; return o; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p += v; return o; }
inline float atomicAdd(float* p, float v) { float o = *p; *p += v; return o; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { unsigned long long o = *p; *p += v; return o; }
inline void __threadfence() {}
namespace emu { inline void syncwarp() { sync_warp(); } }
