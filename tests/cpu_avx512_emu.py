"""NumPy emulations of AVX-512 instructions, generic-IR stand-ins for their intrinsics, and the
asm check, shared by the AVX-512 kernels' tests (pm, T2, K-quants); IQ3_XXS edge blocks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from strata.cpu.kernels.features import AVX512_VBMI_FEATURES, HAS_AVX512_VBMI
from strata.cpu.kernels.iq3 import portable as iq3
from strata.quant import random_quantized
from strata.quant.formats import QT

needs_avx512 = pytest.mark.skipif(
    not HAS_AVX512_VBMI,
    reason=f"host lacks some of {', '.join(sorted(AVX512_VBMI_FEATURES))}",
)

# ---------------------------------------------------------------- the instructions, in NumPy
# (arrays [N, bytes]: N super-blocks at once, one vector register per row)


def pmultishiftqb(ctrl, data):
    """Byte j of qword k: the 8 bits of data's qword k from bit ctrl[8 k + j] & 63, rotating."""
    q = np.repeat(data.view("<u8").astype(np.uint64), 8, axis=1)  # [N, bytes]: the byte's qword
    c = (ctrl & 63).astype(np.uint64)
    rot = (q >> c) | (q << ((np.uint64(64) - c) & np.uint64(63)))
    return (rot & np.uint64(0xFF)).astype(np.uint8)


def vpdpbusd(acc, u8, s8):
    p = u8.astype(np.int32) * s8.view(np.int8).astype(np.int32)
    return acc + p.reshape(p.shape[0], -1, 4).sum(-1, dtype=np.int32)


def packssdw(a, b):
    """Per 128-bit lane: a's four int32 then b's, saturated to int16."""
    sat = lambda v: np.clip(v, -32768, 32767).astype(np.int16).reshape(v.shape[0], -1, 4)  # noqa: E731
    return np.concatenate([sat(a), sat(b)], axis=2).reshape(a.shape[0], -1)


def pmaddwd(a, b):
    p = a.astype(np.int32) * b.astype(np.int32)
    return p.reshape(p.shape[0], -1, 2).sum(-1, dtype=np.int32)


def reference_blocks(bl, x):
    """sum_s (2 ls_s + 1) sum_{i in s} grid_i sign_i x_i, from iq3.iq3_xxs_terms."""
    ((_, sw, _),) = iq3.iq3_xxs_terms(bl)
    return (sw * x.astype(np.int64)).sum(-1)


# ---------------------------------------------------------------- the emulation (any host)


# ---------------------------------------------------------------- the kernel (hosts with it)


def edge_blocks(rng, n_rows: int = 6, nb: int = 8) -> np.ndarray:
    """IQ3_XXS rows [n_rows, nb * 98] holding every grid row and every sign field, with random
    scales, and two blocks of the largest magnitudes, all signs negative, scale 15."""
    w = random_quantized(QT.IQ3_XXS, (n_rows, 256 * nb), rng, 0.05)
    bl = w.reshape(-1, 98)
    n = bl.shape[0]
    field = (np.arange(n * 32) * 5 % 128).reshape(n, 8, 4).astype(np.uint32)
    ls = rng.integers(0, 16, (n, 8)).astype(np.uint32)
    aux = (field << (7 * np.arange(4, dtype=np.uint32))).sum(-1, dtype=np.uint32) | (ls << 28)
    bl[:, 2:66] = (np.arange(n * 64) % 256).reshape(n, 64)
    bl[:, 66:98] = aux.astype("<u4").view(np.uint8).reshape(n, 32)
    bl[:2, 2:66] = 255
    bl[:2, 66:98] = 0xFF
    return w


# ---------------------------------------------------------------- the code an AVX-512 CPU gets

_SPR_FEATURES = ",".join(
    "+" + f
    for f in (
        "avx2 fma f16c bmi bmi2 avx512f avx512bw avx512vl avx512dq avx512cd avx512vbmi "
        "avx512vbmi2 avx512vnni avx512bitalg avx512vpopcntdq"
    ).split()
)

_ASM_SCRIPT = textwrap.dedent(
    """
    import importlib, numba, numpy as np
    from strata.cpu.kernels.features import HAS_AVX512_VBMI
    assert HAS_AVX512_VBMI  # FEATURES follows NUMBA_CPU_FEATURES
    z = np.zeros
    arrs = [z((2, {bb}), np.uint8), z((1, 256), np.int8), z((1, 8), np.float32),
            z((1, 16), np.int16), z((1, 32), np.int16), z((1, 256), np.float32)]
    t = [numba.typeof(v) for v in arrs]
    sig = (t[0], numba.types.intp, *t[1:], numba.types.intp)
    f = getattr(importlib.import_module("strata.cpu.kernels.{module}"), "{fn}")
    f.compile(sig)  # compile only: nothing built for that CPU runs here
    print(f.inspect_asm(sig))
    """
)


def avx512_asm(tmp_path, module: str, fn: str, bb: int) -> tuple[str, list[str]]:
    """The x86 asm of row kernel `fn` (strata.cpu.kernels.<module>, `bb`-byte blocks) compiled
    for Sapphire Rapids in a subprocess with its own Numba cache (so no code for another CPU is
    cached here), checked free of traps; and the mnemonics of its zmm instructions."""
    env = dict(
        os.environ,
        NUMBA_CPU_NAME="sapphirerapids",
        NUMBA_CPU_FEATURES=_SPR_FEATURES,
        NUMBA_CACHE_DIR=str(tmp_path / "numba"),
        PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), *sys.path]),
    )
    code = _ASM_SCRIPT.format(module=module, fn=fn, bb=bb)
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-3000:]
    asm = res.stdout
    assert "ud2" not in asm and "llvm.trap" not in asm
    return asm, [ln.split()[0] for ln in asm.splitlines() if ln.startswith("\t") and "%zmm" in ln]


# ---------------------------------------------------------------- the kernel's own IR, run here

# The IR `iq3.avx512.block_sum` builds, with its AVX-512 intrinsics swapped for generic IR of the
# instructions' semantics (written from Intel's definitions, independently of the NumPy model
# above), compiled for and run on this host. The operand roles were checked against LLVM: it
# constant-folds vpermi2var.qi (table lo, index, table hi) and pshuf.b (table, index), and in
# the asm vpdpbusd takes (acc, u8, s8) and vpmultishiftqb (control, data).


def _vec(ty, vals):
    return "<" + ", ".join(f"{ty} {v}" for v in vals) + ">"


def _byte_gather(name, args, n_table, prologue, index, result):
    """IR of `<64 x i8> name(args)` whose byte i is result(i) of %v{i} = %t[%j{i}]: a lookup
    with a variable index per byte. index(i) / result(i): the IR lines before / after it."""
    body = [prologue] if prologue else []
    for i in range(64):
        prev = "poison" if i == 0 else f"%r{i - 1}"
        body.append(f"  %i{i} = extractelement <64 x i8> %idx, i32 {i}")
        body += index(i)
        body.append(f"  %v{i} = extractelement <{n_table} x i8> %t, i8 %j{i}")
        lines, out = result(i)
        body += lines
        body.append(f"  %r{i} = insertelement <64 x i8> {prev}, i8 {out}, i32 {i}")
    body.append("  ret <64 x i8> %r63")
    return f"define internal <64 x i8> @{name}({args}) {{\n" + "\n".join(body) + "\n}\n"


_PERMI2B = _byte_gather(  # vpermi2b: (lo ++ hi)[idx & 127]
    "generic.vpermi2b",
    "<64 x i8> %lo, <64 x i8> %idx, <64 x i8> %hi",
    128,
    f"  %t = shufflevector <64 x i8> %lo, <64 x i8> %hi, <128 x i32> {_vec('i32', range(128))}",
    lambda i: [f"  %j{i} = and i8 %i{i}, 127"],
    lambda i: ([], f"%v{i}"),
)
_PSHUFB = _byte_gather(  # vpshufb: per 128-bit lane, t[lane + idx & 15], 0 where idx < 0
    "generic.pshufb",
    "<64 x i8> %t, <64 x i8> %idx",
    64,
    "",
    lambda i: [f"  %l{i} = and i8 %i{i}, 15", f"  %j{i} = add i8 %l{i}, {i // 16 * 16}"],
    lambda i: (
        [f"  %n{i} = icmp slt i8 %i{i}, 0", f"  %z{i} = select i1 %n{i}, i8 0, i8 %v{i}"],
        f"%z{i}",
    ),
)
_QWORD_OF_BYTE = _vec("i32", [j // 8 for j in range(32)])
_MULTISHIFT = f"""
define internal <32 x i8> @generic.multishift(<32 x i8> %c, <32 x i8> %d) {{
  %q = bitcast <32 x i8> %d to <4 x i64>
  %r = shufflevector <4 x i64> %q, <4 x i64> poison, <32 x i32> {_QWORD_OF_BYTE}
  %c6 = and <32 x i8> %c, {_vec("i8", [63] * 32)}
  %s = zext <32 x i8> %c6 to <32 x i64>
  %f = call <32 x i64> @llvm.fshr.v32i64(<32 x i64> %r, <32 x i64> %r, <32 x i64> %s)
  %t = trunc <32 x i64> %f to <32 x i8>
  ret <32 x i8> %t
}}
"""
_P4 = "\n".join(
    f"  %p{k} = shufflevector <64 x i32> %p, <64 x i32> poison, <16 x i32> "
    + _vec("i32", range(k, 64, 4))
    for k in range(4)
)
_DPBUSD = f"""
define internal <16 x i32> @generic.dpbusd(<16 x i32> %acc, <16 x i32> %a, <16 x i32> %b) {{
  %a8 = bitcast <16 x i32> %a to <64 x i8>
  %b8 = bitcast <16 x i32> %b to <64 x i8>
  %az = zext <64 x i8> %a8 to <64 x i32>
  %bs = sext <64 x i8> %b8 to <64 x i32>
  %p = mul <64 x i32> %az, %bs
{_P4}
  %s0 = add <16 x i32> %p0, %p1
  %s1 = add <16 x i32> %p2, %p3
  %s2 = add <16 x i32> %s0, %s1
  %s3 = add <16 x i32> %s2, %acc
  ret <16 x i32> %s3
}}
"""
_PACK = _vec("i32", [4 * k + i + 16 * h for k in range(4) for h in range(2) for i in range(4)])
_PACKSSDW = f"""
define internal <32 x i16> @generic.packssdw(<16 x i32> %a, <16 x i32> %b) {{
  %ab = shufflevector <16 x i32> %a, <16 x i32> %b, <32 x i32> {_PACK}
  %lo = call <32 x i32> @llvm.smax.v32i32(<32 x i32> %ab, <32 x i32> {_vec("i32", [-32768] * 32)})
  %hi = call <32 x i32> @llvm.smin.v32i32(<32 x i32> %lo, <32 x i32> {_vec("i32", [32767] * 32)})
  %t = trunc <32 x i32> %hi to <32 x i16>
  ret <32 x i16> %t
}}
"""
_PMADDWD = f"""
define internal <16 x i32> @generic.pmaddwd(<32 x i16> %a, <32 x i16> %b) {{
  %as = sext <32 x i16> %a to <32 x i32>
  %bs = sext <32 x i16> %b to <32 x i32>
  %p = mul <32 x i32> %as, %bs
  %e = shufflevector <32 x i32> %p, <32 x i32> poison, <16 x i32> {_vec("i32", range(0, 32, 2))}
  %o = shufflevector <32 x i32> %p, <32 x i32> poison, <16 x i32> {_vec("i32", range(1, 32, 2))}
  %s = add <16 x i32> %e, %o
  ret <16 x i32> %s
}}
declare <32 x i64> @llvm.fshr.v32i64(<32 x i64>, <32 x i64>, <32 x i64>)
declare <32 x i32> @llvm.smax.v32i32(<32 x i32>, <32 x i32>)
declare <32 x i32> @llvm.smin.v32i32(<32 x i32>, <32 x i32>)
"""
_DPWSSD = """
define internal <16 x i32> @generic.dpwssd(<16 x i32> %acc, <16 x i32> %a, <16 x i32> %b) {
  %a16 = bitcast <16 x i32> %a to <32 x i16>
  %b16 = bitcast <16 x i32> %b to <32 x i16>
  %m = call <16 x i32> @generic.pmaddwd(<32 x i16> %a16, <32 x i16> %b16)
  %s = add <16 x i32> %m, %acc
  ret <16 x i32> %s
}
"""
_GENERIC = _PERMI2B + _PSHUFB + _MULTISHIFT + _DPBUSD + _PACKSSDW + _PMADDWD + _DPWSSD
_RENAME = {
    "llvm.x86.avx512.vpdpwssd.512": "generic.dpwssd",
    "llvm.x86.avx512.vpermi2var.qi.512": "generic.vpermi2b",
    "llvm.x86.avx512.pshuf.b.512": "generic.pshufb",
    "llvm.x86.avx512.pmultishift.qb.256": "generic.multishift",
    "llvm.x86.avx512.vpdpbusd.512": "generic.dpbusd",
    "llvm.x86.avx512.packssdw.512": "generic.packssdw",
    "llvm.x86.avx512.pmaddw.d.512": "generic.pmaddwd",
}


def jit_generic(mod, rename: dict, generic: str, swapped: str = "llvm.x86", features: str = ""):
    """An MCJIT engine for `mod` (llvmlite IR built by a kernel's codegen) with the x86 intrinsics
    whose names start with `swapped` replaced by generic IR twins: their declarations dropped,
    calls renamed by `rename`, the twins' definitions (`generic`) appended. Keep the engine alive
    while its functions are called."""
    from llvmlite import binding as llb

    text = "\n".join(
        ln for ln in str(mod).splitlines() if not (ln.startswith("declare") and swapped in ln)
    )
    for old, new in rename.items():
        text = text.replace(f'"{old}"', f'"{new}"')
    assert swapped not in text  # every such intrinsic it uses has a generic twin here
    llb.initialize_native_target()
    llb.initialize_native_asmprinter()
    m = llb.parse_assembly(text + generic)
    m.verify()
    tm = llb.Target.from_default_triple().create_target_machine(features=features, opt=2)
    engine = llb.create_mcjit_compiler(m, tm)
    engine.finalize_object()
    return engine
