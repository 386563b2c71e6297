"""AVX-512 VBMI + VNNI building blocks for IQ1_M (t2_avx512.py's T2 kernel uses them).

`M2_TAB` holds (2 ls + 1)(dl - 8) for the delta-and-offset term, `_iq1m_d_pext` the super-block's
f16 d from the scale words' top nibbles (one pext with bmi2); the rest wrap single instructions.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from strata.cpu.kernels.common import f16_to_f32_ir
from strata.cpu.kernels.features import FEATURES, HAS_AVX512_VBMI
from strata.cpu.kernels.simd import I8, I16, I32, I64, Emit

V64I8 = ir.VectorType(I8, 64)
V16I32 = ir.VectorType(I32, 16)

# ---------------------------------------------------------------- constant tables


# vpermw table (5 index bits; bit 4 is a neighbour's bit: two copies): (2 ls + 1)(dl - 8)
M2_TAB = np.array([(2 * (i & 7) + 1) * (-9 if i & 8 else -7) for i in range(32)], np.int16)


def _i8(values):
    """uint8 values as the signed ints an IR i8 constant takes."""
    return [int(v) - 256 if v > 127 else int(v) for v in np.asarray(values).ravel()]


# ---------------------------------------------------------------- IR pieces


def _multishift(e: Emit, ctrl, data):
    """vpmultishiftqb: byte i = the 8 bits of data's qword i // 8 from bit ctrl[i] (rotating)."""
    return e._call("llvm.x86.avx512.pmultishift.qb.512", V64I8, [e.const(V64I8, _i8(ctrl)), data])


def _dpbusd(e: Emit, acc, u8, s8):
    return e._call("llvm.x86.avx512.vpdpbusd.512", V16I32, [acc, u8, s8])


def _pmaddwd(e: Emit, a, b):
    return e._call("llvm.x86.avx512.pmaddw.d.512", V16I32, [a, b])


def _fence(e: Emit, p):
    """An empty asm that may write memory at p: loads after it are not taken from vectors
    loaded before (LLVM would rebuild the scale qword from the first loads with vpermq /
    vextract + vpextrq, three shuffle-port uops, where a broadcast and a scalar load are free)."""
    e.b.asm(ir.FunctionType(ir.VoidType(), [p.type]), "", "r,~{memory}", [p], True)


def d_bits(e: Emit, pw):
    """The f16 bits of d (the top nibbles of the four scale words) as an i16: one pext (or its
    shifts and masks where the host lacks bmi2)."""
    b = e.b
    words = e.load(pw, I64, 48)
    if "bmi2" in FEATURES:
        mask = ir.Constant(I64, 0xF000F000F000F000 - (1 << 64))
        return b.trunc(e._call("llvm.x86.bmi.pext.64", I64, [words, mask]), I16)
    bits = ir.Constant(I64, 0)
    for k in range(4):  # nibble k: bits 16 k + 12 .. -> 4 k ..
        nib = b.and_(b.lshr(words, ir.Constant(I64, 12 * k + 12)), ir.Constant(I64, 15 << 4 * k))
        bits = b.or_(bits, nib)
    return b.trunc(bits, I16)


@intrinsic
def _iq1m_d_pext(typingctx, w, r, o):
    """The f16 super-block scale of the IQ1_M block at w[r, o:o+56], as float32 (`iq1.iq1m_d`)."""
    sig = types.float32(w, types.intp, types.intp)

    def codegen(context, builder, sg, args):
        e = Emit(context, builder)
        if not HAS_AVX512_VBMI:
            e.trap()
            return ir.Constant(ir.FloatType(), 0.0)
        pw = e.ptr(sg.args[0], args[0], args[1], args[2])
        _fence(e, pw)  # a load of its own, not the block's broadcast moved through vpbroadcastq
        return f16_to_f32_ir(builder, d_bits(e, pw))

    return sig, codegen


# ---------------------------------------------------------------- row kernel (the float steps of
# iq1.dot_iq1_m, in the same order)
