"""x86 SIMD from @njit code: CPU feature detection and LLVM-IR building blocks for intrinsics.

Numba has no vector types, but `numba.extending.intrinsic` lets a kernel emit LLVM IR inline; the
IR below uses LLVM's x86 intrinsics (vpmaddubsw, vpmaddwd, vpshufb) on 256-bit vectors, so the
integer dot products run 32 bytes at a time instead of being widened to int64 lanes.

Every SIMD kernel has a plain @njit twin (the portable path and the test oracle). Codegen checks
the host features: on a machine without AVX2 the intrinsics emit a trap, and the dispatcher never
selects them (features.py).
"""

from __future__ import annotations

import sys

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_to_f32_ir
from strata.cpu.kernels.features import FEATURES, HAS_AVX2

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
V32I8 = ir.VectorType(I8, 32)
V16I8 = ir.VectorType(I8, 16)
V16I16 = ir.VectorType(I16, 16)
V8I32 = ir.VectorType(I32, 8)


class Emit:
    """Small IR vocabulary over one `builder` (what the kernels are written in)."""

    def __init__(self, context, builder):
        self.c = context
        self.b = builder
        self.mod = builder.module

    # ---- memory
    def ptr(self, aryty, ary, *inds):
        """i8* to element `inds` of a Numba array value (any layout; no bounds check)."""
        a = self.c.make_array(aryty)(self.c, self.b, ary)
        shape = cgutils.unpack_tuple(self.b, a.shape, aryty.ndim)
        strides = cgutils.unpack_tuple(self.b, a.strides, aryty.ndim)
        p = cgutils.get_item_pointer2(
            self.c, self.b, a.data, shape, strides, aryty.layout, list(inds)
        )
        return self.b.bitcast(p, I8.as_pointer())

    def off(self, p, nbytes):
        """p + nbytes (nbytes: an int or an IR integer)."""
        if isinstance(nbytes, int):
            nbytes = ir.Constant(I64, nbytes)
        return self.b.gep(p, [nbytes])

    def load(self, p, ty, nbytes=0):
        q = self.b.bitcast(self.off(p, nbytes) if nbytes else p, ty.as_pointer())
        return self.b.load(q, align=1)

    # ---- constants and lanes
    @staticmethod
    def const(ty, values):
        return ir.Constant(ty, list(values))

    def splat(self, ty, value):
        return ir.Constant(ty, [value] * ty.count)

    def shuffle(self, v, lanes):
        mask = ir.Constant(ir.VectorType(I32, len(lanes)), list(lanes))
        return self.b.shuffle_vector(v, ir.Constant(v.type, None), mask)

    def bcast(self, scalar, ty):
        """A vector of type ty with every lane the scalar (same element type)."""
        v = self.b.insert_element(ir.Constant(ty, None), scalar, ir.Constant(I32, 0))
        return self.shuffle(v, [0] * ty.count)

    # ---- x86 intrinsics (AVX2)
    def _call(self, name, ret, args):
        fn = cgutils.get_or_insert_function(
            self.mod, ir.FunctionType(ret, [a.type for a in args]), name
        )
        return self.b.call(fn, args)

    def maddubs(self, u8, s8):
        """vpmaddubsw: u8 x s8 byte products summed in pairs to int16 (saturating; keep u8 <= 127
        or the pair sums in range and it is exact)."""
        return self._call("llvm.x86.avx2.pmadd.ub.sw", V16I16, [u8, s8])

    def madd(self, a16, b16):
        """vpmaddwd: int16 products summed in pairs to int32 (exact)."""
        return self._call("llvm.x86.avx2.pmadd.wd", V8I32, [a16, b16])

    def pshufb(self, table, idx):
        """vpshufb: per 128-bit lane, byte i = table[idx[i] & 15] (0 where idx[i] < 0)."""
        return self._call("llvm.x86.avx2.pshuf.b", V32I8, [table, idx])

    def hsum(self, v8i32):
        return self._call("llvm.vector.reduce.add.v8i32", I32, [v8i32])

    # ---- byte nibbles
    def nibbles(self, v32i8):
        """(low nibbles, high nibbles) of 32 bytes, each as 32 bytes 0..15."""
        m = self.splat(V32I8, 0x0F)
        lo = self.b.and_(v32i8, m)
        hi = self.b.and_(self.b.lshr(v32i8, self.splat(V32I8, 4)), m)
        return lo, hi

    def trap(self):
        self._call("llvm.trap", ir.VoidType(), [])


def const_table(e: Emit, name: str, ty, values):
    """i8* to an internal constant table (64-byte aligned) in the module being built, made once
    per module: the grid and sign tables of the i-quant kernels."""
    try:
        gv = e.mod.get_global(name)
    except KeyError:
        arr = ir.ArrayType(ty, len(values))
        gv = ir.GlobalVariable(e.mod, arr, name)
        gv.linkage = "internal"
        gv.global_constant = True
        gv.initializer = ir.Constant(arr, values)
        gv.align = 64
    return e.b.bitcast(gv, I8.as_pointer())


def f16_load(e: Emit, p):
    """float32 from the f16 at i8* p."""
    return f16_to_f32_ir(e.b, e.load(p, I16))


def _prefetch_row_codegen(locality: int):
    """Codegen of a row prefetch with LLVM's locality hint (3: into L1, prefetcht0; 2: into
    L2, prefetcht1)."""

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        p = e.ptr(sg.args[0], args[0], args[1], ir.Constant(I64, 0))
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]),
            "llvm.prefetch.p0i8",  # LLVM upgrades the typed-pointer name where pointers are opaque
        )
        # every line the row touches wherever it starts: (nbytes + 127) // 64 lines
        lines = builder.udiv(builder.add(args[2], ir.Constant(I64, 127)), ir.Constant(I64, 64))
        with cgutils.for_range(builder, lines) as loop:
            q = builder.gep(p, [builder.mul(loop.index, ir.Constant(I64, 64))])
            builder.call(
                fn, [q, ir.Constant(I32, 0), ir.Constant(I32, locality), ir.Constant(I32, 1)]
            )
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch_row(typingctx, w, r, nbytes):
    """Software-prefetch `nbytes` of row r of the 2-D array w (every 64-byte line) into L1."""
    return types.void(w, types.intp, types.intp), _prefetch_row_codegen(3)


@intrinsic
def prefetch_row_l2(typingctx, w, r, nbytes):
    """prefetch_row into L2 only (prefetcht1): the core's L1 fill buffers stay free for the
    kernel's own loads; the L2 tracks more misses in flight."""
    return types.void(w, types.intp, types.intp), _prefetch_row_codegen(2)


def absb(e: Emit, v):
    """|v| of signed bytes (vpabsb)."""
    return e._call("llvm.abs.v32i8", V32I8, [v, ir.Constant(ir.IntType(1), 0)])


def signb(e: Emit, x, s):
    """x with the sign of s applied, 0 where s is 0 (vpsignb)."""
    return e._call("llvm.x86.avx2.psign.b", V32I8, [x, s])


def concat16(e: Emit, lo, hi):
    """Two <16 x i8> halves into one <32 x i8> (vinserti128)."""
    return e.b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 32), list(range(32))))


# ---- atomics for the pool's in-region barrier (plain LLVM IR: every target has them)


def _elem_ptr(context, builder, aryty, ary, i):
    """A pointer to arr[i] typed as the array's element (i32* / i64*)."""
    p = Emit(context, builder).ptr(aryty, ary, i)
    return builder.bitcast(p, context.get_value_type(aryty.dtype).as_pointer())


@intrinsic
def atomic_add(typingctx, arr, i, v):
    """arr[i] += v atomically (seq_cst) on an int64 array; returns the old value."""
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, sg, args):
        p = _elem_ptr(context, builder, sg.args[0], args[0], args[1])
        return builder.atomic_rmw("add", p, args[2], "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, arr, i):
    """arr[i] of an int32 or int64 array as an acquire load (sees what other threads, or a
    device writing pinned memory, published; never hoisted out of a wait loop)."""
    dt = arr.dtype
    sig = dt(arr, types.intp)

    def codegen(context, builder, sg, args):
        p = _elem_ptr(context, builder, sg.args[0], args[0], args[1])
        return builder.load_atomic(p, "acquire", dt.bitwidth // 8)

    return sig, codegen


@intrinsic
def atomic_store(typingctx, arr, i, v):
    """arr[i] = v (an integer array) as a release store: whatever this thread wrote before it is
    seen by a thread, or a device polling pinned memory, that sees the new value."""
    dt = arr.dtype
    sig = types.void(arr, types.intp, types.int64)

    def codegen(context, builder, sg, args):
        p = _elem_ptr(context, builder, sg.args[0], args[0], args[1])
        val = context.cast(builder, args[2], types.int64, dt)
        builder.store_atomic(val, p, "release", dt.bitwidth // 8)
        return context.get_dummy_value()

    return sig, codegen


V8F16 = ir.VectorType(ir.HalfType(), 8)
V8F32 = ir.VectorType(ir.FloatType(), 8)


def _half_ops(context, builder, sg, args, round_trip: bool) -> None:
    """dst[di : di + 8] = float32(src[si : si + 8]): src uint16 f16 bits (vcvtph2ps), or with
    `round_trip` src float32 rounded to f16 and back (vcvtps2ph, to nearest even: numpy's
    astype(float16) bit for bit). F16C hosts only (`HAS_AVX2` includes it): elsewhere the
    callers take NumPy's casts."""
    ps = _elem_ptr(context, builder, sg.args[0], args[0], args[1])
    pd = _elem_ptr(context, builder, sg.args[2], args[2], args[3])
    if not HAS_AVX2:
        cgutils.printf(builder, "strata: F16C kernel called on a host without it\n")
        return
    if round_trip:
        v = builder.load(builder.bitcast(ps, V8F32.as_pointer()), align=4)
        v = builder.fpext(builder.fptrunc(v, V8F16), V8F32)
    else:
        v = builder.fpext(builder.load(builder.bitcast(ps, V8F16.as_pointer()), align=2), V8F32)
    builder.store(v, builder.bitcast(pd, V8F32.as_pointer()), align=4)


@intrinsic
def f16x8_to_f32(typingctx, src, si, dst, di):
    """dst[di : di + 8] = the f16 values whose bits are src[si : si + 8] (uint16), as float32."""
    sig = types.void(src, types.intp, dst, types.intp)

    def codegen(context, builder, sg, args):
        _half_ops(context, builder, sg, args, round_trip=False)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def f32x8_round_f16(typingctx, src, si, dst, di):
    """dst[di : di + 8] = src[si : si + 8] (float32) rounded to f16 precision, as float32."""
    sig = types.void(src, types.intp, dst, types.intp)

    def codegen(context, builder, sg, args):
        _half_ops(context, builder, sg, args, round_trip=True)
        return context.get_dummy_value()

    return sig, codegen


_X86 = bool({"sse2", "avx2"} & FEATURES)


def _pause(builder) -> None:
    """Emit x86 `pause` (the spin-wait hint)."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"
    )
    builder.call(fn, [])


@intrinsic
def cpu_relax(typingctx):
    """The spin-wait hint (x86 `pause`; nothing elsewhere)."""
    sig = types.void()

    def codegen(context, builder, sg, args):
        if _X86:
            _pause(builder)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def cycle_counter(typingctx):
    """The core's cycle/tick counter (LLVM readcyclecounter: rdtsc on x86, the virtual counter
    on Arm; 0 where a target has none): cheap timestamps for the pool's phase trace."""
    sig = types.int64()

    def codegen(context, builder, sg, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(I64, []), "llvm.readcyclecounter"
        )
        return builder.call(fn, [])

    return sig, codegen


_HAS_SCHED_YIELD = sys.platform.startswith(("linux", "darwin", "freebsd"))


@intrinsic
def os_yield(typingctx):
    """Give the core to another runnable thread (POSIX sched_yield; a `pause` elsewhere): a spin
    wait on a machine with more runnable threads than cores must not hold the core the thread it
    waits for needs."""
    sig = types.void()

    def codegen(context, builder, sg, args):
        if _HAS_SCHED_YIELD:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(I32, []), "sched_yield"
            )
            builder.call(fn, [])
        elif _X86:
            _pause(builder)
        return context.get_dummy_value()

    return sig, codegen
