"""NumPy emulation helpers for IQ1_M's AVX-512 building blocks (iq1/avx512.py), used by the T2
kernel's tests: the f16 d by pext, the generic IR of the instructions, edge-case blocks."""

from __future__ import annotations

import numpy as np

from tests.cpu_avx512_emu import (
    _DPBUSD,
    _PACKSSDW,
    _PMADDWD,
    _vec,
)


def emulate_d(bl):
    """pext of the scale qword with 0xF000F000F000F000, as the f16 it is, in float32."""
    q = np.ascontiguousarray(bl[:, 48:56]).view("<u8")[:, 0]
    bits = sum(
        ((q >> np.uint64(16 * k + 12)) & np.uint64(15)) << np.uint64(4 * k) for k in range(4)
    )
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def every_index_delta_and_scale(bl, rng):
    """Set blocks bl [n, 56] (in place) to cover every 11-bit grid index, both delta signs in
    random places, and every 3-bit scale; the f16 d nibbles are kept."""
    n = bl.shape[0]
    idx = (np.arange(n * 32) * 7 % 2048).reshape(n, 32)  # odd stride: every index, scattered
    nib = (idx >> 8) | (rng.integers(0, 2, (n, 32)) << 3)
    bl[:, 0:32] = idx & 255
    bl[:, 32:48] = nib[:, 0::2] | (nib[:, 1::2] << 4)
    words = bl[:, 48:56].copy().view("<u2")  # [n, 4]
    ls = ((np.arange(n * 16) + rng.integers(0, 8)) % 8).reshape(n, 4, 4).astype(np.uint16)
    words[:] = (words & 0xF000) | (ls << (3 * np.arange(4, dtype=np.uint16))).sum(-1, np.uint16)
    bl[:, 48:56] = words.view(np.uint8)


# ---------------------------------------------------------------- the emulation (any host)


# ---------------------------------------------------------------- the kernel (hosts with it)


# ---------------------------------------------------------------- the code an AVX-512 CPU gets


# ---------------------------------------------------------------- the kernel's own IR, run here

# `iq1.avx512.block_sum`'s IR with its AVX-512 intrinsics swapped for generic IR of their
# semantics (written from Intel's definitions; vpdpbusd, vpackssdw, vpmaddwd as in
# test_cpu_iq3_vbmi), compiled for and run on this host. The operand roles were checked
# against LLVM: in the asm, vpermw takes (table, index) (it folds the constant table as the
# memory operand) and the masked gather (passthru, base, index, mask, scale).


def _lanes(name, args, ty, n, body):
    """IR of `ty name(args)` whose lane i is computed by body(i) (IR lines, result name)."""
    lines = []
    for i in range(n):
        prev = "poison" if i == 0 else f"%r{i - 1}"
        code, out = body(i)
        lines += code + [
            f"  %r{i} = insertelement {ty} {prev}, {ty.split()[2][:-1]} {out}, i32 {i}"
        ]
    lines.append(f"  ret {ty} %r{n - 1}")
    return f"define internal {ty} @{name}({args}) {{\n" + "\n".join(lines) + "\n}\n"


_GATHER = _lanes(  # vpgatherdd, all lanes: base[4 idx[i]]
    "generic.gather",
    "<16 x i32> %src, ptr %base, <16 x i32> %idx, <16 x i1> %m, i32 %scale",
    "<16 x i32>",
    16,
    lambda i: (
        [
            f"  %i{i} = extractelement <16 x i32> %idx, i32 {i}",
            f"  %o{i} = sext i32 %i{i} to i64",
            f"  %q{i} = getelementptr i32, ptr %base, i64 %o{i}",
            f"  %v{i} = load i32, ptr %q{i}, align 4",
        ],
        f"%v{i}",
    ),
)
_PERMW = _lanes(  # vpermw: table[idx & 31]
    "generic.permw",
    "<32 x i16> %t, <32 x i16> %idx",
    "<32 x i16>",
    32,
    lambda i: (
        [
            f"  %i{i} = extractelement <32 x i16> %idx, i32 {i}",
            f"  %j{i} = and i16 %i{i}, 31",
            f"  %v{i} = extractelement <32 x i16> %t, i16 %j{i}",
        ],
        f"%v{i}",
    ),
)
_QWORD_OF_BYTE = _vec("i32", [j // 8 for j in range(64)])
_MULTISHIFT = f"""
define internal <64 x i8> @generic.multishift(<64 x i8> %c, <64 x i8> %d) {{
  %q = bitcast <64 x i8> %d to <8 x i64>
  %r = shufflevector <8 x i64> %q, <8 x i64> poison, <64 x i32> {_QWORD_OF_BYTE}
  %c6 = and <64 x i8> %c, {_vec("i8", [63] * 64)}
  %s = zext <64 x i8> %c6 to <64 x i64>
  %f = call <64 x i64> @llvm.fshr.v64i64(<64 x i64> %r, <64 x i64> %r, <64 x i64> %s)
  %t = trunc <64 x i64> %f to <64 x i8>
  ret <64 x i8> %t
}}
declare <64 x i64> @llvm.fshr.v64i64(<64 x i64>, <64 x i64>, <64 x i64>)
"""
_GENERIC = _GATHER + _PERMW + _MULTISHIFT + _DPBUSD + _PACKSSDW + _PMADDWD
_RENAME = {
    "llvm.x86.avx512.mask.gather.dpi.512": "generic.gather",
    "llvm.x86.avx512.permvar.hi.512": "generic.permw",
    "llvm.x86.avx512.pmultishift.qb.512": "generic.multishift",
    "llvm.x86.avx512.vpdpbusd.512": "generic.dpbusd",
    "llvm.x86.avx512.packssdw.512": "generic.packssdw",
    "llvm.x86.avx512.pmaddw.d.512": "generic.pmaddwd",
}
