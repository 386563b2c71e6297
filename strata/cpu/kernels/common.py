"""Scalar helpers every kernel family shares: half/bfloat conversions as LLVM does them.

Numba has no float16 scalar on the CPU; these intrinsics emit plain (target-independent) LLVM IR
(`fpext`/`fptrunc half`, `bitcast`), which x86 lowers to F16C and Arm to its native converts.
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import binding as llb
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from strata.cpu.kernels.features import FEATURES

F32 = ir.FloatType()
HALF = ir.HalfType()
I16 = ir.IntType(16)
I32 = ir.IntType(32)


# x86 with F16C: a scalar half -> float as `fpext` lowers to vpinsrw into whatever register LLVM
# picks for the undefined lanes (often a loop's float accumulator), then vcvtph2ps: a false
# dependency that chains every block's scale onto the previous block's sums (the Q4_K, Q5_K,
# Q6_K and IQ4_XS AVX2 kernels 5-14% slower on one EPYC core). vmovd from a general register
# zeroes the rest of the vector.
X86_F16C = "f16c" in FEATURES and platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
if X86_F16C:
    llb.initialize_native_asmparser()  # the JIT's streamer parses inline asm only with it


def f16_to_f32_ir(builder: ir.IRBuilder, h16: ir.Value) -> ir.Value:
    """float32 of the f16 bits h16 (an i16): exact, as `fpext half` (vmovd + vcvtph2ps on
    x86 hosts with F16C, without the false dependency; the generic cast elsewhere)."""
    if X86_F16C:
        fty = ir.FunctionType(F32, [I32])
        asm = "vmovd $1, $0\n\tvcvtph2ps $0, $0"
        return builder.asm(fty, asm, "=x,r", [builder.zext(h16, I32)], False)
    return builder.fpext(builder.bitcast(h16, HALF), F32)


@intrinsic
def f16_bits_to_f32(typingctx, bits):
    """The float32 value of an IEEE half given by its 16 bits (any integer type)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        v = builder.trunc(args[0], I16) if args[0].type.width > 16 else args[0]
        if v.type.width < 16:
            v = builder.zext(v, I16)
        return f16_to_f32_ir(builder, v)

    return sig, codegen


@intrinsic
def round_f16(typingctx, x):
    """float32 -> half (round to nearest even, overflow to inf, as F16C) -> float32."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], HALF), F32)

    return sig, codegen


@intrinsic
def f16_bits(typingctx, x):
    """The IEEE half bits (uint16) of float32 x: round to nearest even, overflow to inf (numpy's
    astype(float16))."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], HALF), I16)

    return sig, codegen


@intrinsic
def f32_bits(typingctx, x):
    """The 32 bits of a float32 as uint32."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], I32)

    return sig, codegen


@intrinsic
def bits_f32(typingctx, u):
    """The float32 whose bits are the uint32 `u`."""
    sig = types.float32(types.uint32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], F32)

    return sig, codegen


@njit(cache=True)
def round_bf16(x):
    """float32 -> bf16 -> float32 as GGML_FP32_TO_BF16: nearest even, NaN kept quiet."""
    u = f32_bits(x)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        r = (u >> np.uint32(16)) | np.uint32(64)
    else:
        r = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    return bits_f32(r << np.uint32(16))


@njit(cache=True, inline="always")
def f16_at(w, r, o):
    """The f16 stored little-endian at bytes o, o+1 of row r of the uint8 matrix w, as float32."""
    return f16_bits_to_f32(np.uint16(w[r, o]) | (np.uint16(w[r, o + 1]) << np.uint16(8)))
