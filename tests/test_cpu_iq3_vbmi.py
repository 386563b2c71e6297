"""The AVX-512 VBMI IQ3_XXS kernel (iq3_vbmi.py).

Everywhere (no AVX-512 needed): a NumPy emulation of its instructions, on the module's own
tables, equals a plain reference per super-block and `iq3.dot_iq3_xxs` bit for bit per row; the
kernel's own block IR, its x86 intrinsics swapped for generic IR of the same semantics, runs
here and gives the reference sums; compiled for an AVX-512 CPU it has the instructions it is
written for and no trap. Where the host has every feature it uses: the kernel itself against the
portable kernel (bits) and gguf's dequantization.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gguf.quants import dequantize

from strata.cpu import layout as L
from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels import iq3
from strata.cpu.kernels import iq3_vbmi as V
from strata.cpu.kernels.simd import AVX512_VBMI_FEATURES, HAS_AVX512_VBMI
from strata.cpu.quantize import quantize_act
from strata.quant import activation as A
from strata.quant import random_quantized
from strata.quant.formats import QT
from tests.test_cpu_kernels import _activations, _gemv

needs_avx512 = pytest.mark.skipif(
    not HAS_AVX512_VBMI,
    reason=f"host lacks some of {', '.join(sorted(AVX512_VBMI_FEATURES))}",
)

# ---------------------------------------------------------------- the instructions, in NumPy
# (arrays [N, bytes]: N super-blocks at once, one vector register per row)


def vpermb(src, idx):
    return src[:, idx & 63]


def vpermi2b(lo, idx, hi):
    """Two 64-byte tables (constants), 7 index bits."""
    return np.concatenate([lo, hi])[idx & 127]


def punpck(a, b, high):
    """vpunpcklbw (high=0) / vpunpckhbw (high=1): per 128-bit lane, bytes of a and b alternate,
    from the lane's low (high) 8 bytes."""
    out = np.empty_like(a)
    for k in range(a.shape[1] // 16):
        src = slice(16 * k + 8 * high, 16 * k + 8 * high + 8)
        out[:, 16 * k : 16 * k + 16 : 2] = a[:, src]
        out[:, 16 * k + 1 : 16 * k + 16 : 2] = b[:, src]
    return out


def psrlw(v, n):
    return (np.ascontiguousarray(v).view("<u2") >> n).astype("<u2").view(np.uint8)


def pshufb(table, idx):
    """Per 128-bit lane: table[lane base + idx & 15], 0 where bit 7 of idx is set."""
    base = np.arange(idx.shape[1]) // 16 * 16
    return np.where(idx & 0x80, 0, table[base + (idx & 15)]).astype(np.uint8)


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


def emulate_blocks(bl, x):
    """The kernel's int32 sum per super-block, instruction by instruction: bl uint8 [N, 98]
    blocks, x int8 [N, 256] their activation quants."""

    def lut(t, p, neg):  # 256 entries: two vpermi2b, the half picked by bit 7
        return np.where(neg, vpermi2b(t[128:192], p, t[192:]), vpermi2b(t[:64], p, t[64:128]))

    p = vpermb(bl[:, 2:66], V.PERM)
    neg = p >= 128  # vpmovb2m
    la, lb = lut(V.LUT_A, p, neg), lut(V.LUT_B, p, neg)
    mags = []
    for u in (punpck(la, lb, 0), punpck(la, lb, 1)):
        o = psrlw(u, 4)
        mags += [pshufb(V.MAG, punpck(u, o, 0)), pshufb(V.MAG, punpck(u, o, 1))]
    aux = np.ascontiguousarray(bl[:, 66:98])
    fields = pmultishiftqb(V.SHIFTS, aux)
    signs = vpermi2b(V.KSIGNS_TAB[:64], fields, V.KSIGNS_TAB[64:])  # [N, 32]
    masks = np.ascontiguousarray(signs).view("<u8")  # [N, 4]: kmovq
    bit = np.arange(64, dtype=np.uint64)
    dots = []
    for q in range(4):
        m = ((masks[:, q : q + 1] >> bit) & np.uint64(1)).astype(bool)
        xq = x[:, 64 * q : 64 * q + 64]
        xs = np.where(m, -xq.astype(np.int16), xq).astype(np.int8)  # vpsubb under the mask
        dots.append(vpdpbusd(np.zeros((len(bl), 16), np.int32), mags[q], xs))
    sc = ((aux.view("<u4") >> 27) & 0x1E) | 1  # [N, 8] 2 ls + 1
    words = sc.astype("<u4").view(np.int16)  # [N, 16]: word 2 s = 2 ls_s + 1, word 2 s + 1 = 0
    acc = np.zeros((len(bl), 16), np.int32)
    for h in range(2):
        acc += pmaddwd(packssdw(dots[2 * h], dots[2 * h + 1]), words[:, 2 * V.SC_WORDS[h]])
    return acc.sum(-1, dtype=np.int32)


def reference_blocks(bl, x):
    """sum_s (2 ls_s + 1) sum_{i in s} grid_i sign_i x_i, from iq3.iq3_xxs_terms."""
    ((_, sw, _),) = iq3.iq3_xxs_terms(bl)
    return (sw * x.astype(np.int64)).sum(-1)


def emulate_row_dots(w, act):
    """dot_iq3_xxs_vbmi's result [n_act, rows]: the emulated block sums through the float steps
    of iq3.dot_iq3_xxs, in float32, in its order."""
    xq, xd = act[0], act[1]
    rows, nb = w.shape[0], w.shape[1] // 98
    bl = w.reshape(rows * nb, 98)
    d = bl[:, 0:2].copy().view("<f2").astype(np.float32).reshape(rows, nb)
    y = np.zeros((xq.shape[0], rows), np.float32)
    for a in range(xq.shape[0]):
        isum = emulate_blocks(bl, np.tile(xq[a].reshape(nb, 256), (rows, 1))).reshape(rows, nb)
        for r in range(rows):
            acc = np.float32(0.0)
            for b in range(nb):
                acc += np.float32(xd[a, b] * d[r, b]) * np.float32(isum[r, b]) * np.float32(0.25)
            y[a, r] = acc
    return y


# ---------------------------------------------------------------- the emulation (any host)


def test_unpack_masks_are_the_instructions():
    """The kernel writes the unpacks as shufflevector masks: they must be vpunpck{l,h}bw."""
    rng = np.random.default_rng()
    a, b = rng.integers(0, 256, (2, 3, 64), dtype=np.uint8)
    ab = np.concatenate([a, b], axis=1)
    assert np.array_equal(ab[:, V.UNPACK_LO], punpck(a, b, 0))
    assert np.array_equal(ab[:, V.UNPACK_HI], punpck(a, b, 1))
    assert np.array_equal(V.PERM[V.PERM], np.arange(64))  # an involution, moving dwords only
    assert np.array_equal(V.PERM.reshape(16, 4) % 4, np.tile(np.arange(4), (16, 1)))


def test_emulated_block_sums_equal_the_reference():
    """Random blocks: every qs byte, every scale, every sign field, +-127 activations."""
    rng = np.random.default_rng()
    n = 2048
    bl = rng.integers(0, 256, (n, 98), dtype=np.uint8)
    bl[:, 0:2] = 0  # d (not used by the sums; random bits may be NaN)
    bl[:4, 2:66] = np.arange(256, dtype=np.uint8).reshape(4, 64)  # every grid row
    bl[4, 66:98], bl[5, 66:98] = 0xFF, 0  # all signs negative / none; scale 15 / 0
    x = rng.integers(-127, 128, (n, 256)).astype(np.int8)
    x[:8] = np.where(rng.integers(0, 2, (8, 256)), 127, -127)
    assert np.array_equal(emulate_blocks(bl, x), reference_blocks(bl, x))


def test_emulated_rows_equal_the_portable_kernel_bit_for_bit():
    rng = np.random.default_rng()
    w = random_quantized(QT.IQ3_XXS, (5, 768), rng, 0.05)
    act = quantize_act(_activations(rng, 5, 768), QT.Q8_K)
    got = emulate_row_dots(w, act)
    want = _gemv(K.K_IQ3_XXS, w, act, 5)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------- the kernel (hosts with it)


def _check(w, x):
    act = quantize_act(x, QT.Q8_K)
    got = _gemv(K.K_IQ3_XXS_VBMI, w, act, x.shape[0])
    want = _gemv(K.K_IQ3_XXS, w, act, x.shape[0])
    assert np.array_equal(got, want), np.abs(got - want).max()
    ref = (
        A.roundtrip(x.astype(np.float64), QT.Q8_K) @ dequantize(w, QT.IQ3_XXS).astype(np.float64).T
    )
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()


@needs_avx512
@pytest.mark.parametrize("cols", [256, 768, 2048])
def test_kernel_matches_portable_kernel_and_dequant(cols):
    rng = np.random.default_rng()
    _check(random_quantized(QT.IQ3_XXS, (7, cols), rng, 0.05), _activations(rng, 5, cols))


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


@needs_avx512
def test_kernel_every_grid_row_sign_field_and_extreme():
    rng = np.random.default_rng()
    w = edge_blocks(rng)
    x = _activations(rng, 5, 256 * 8)
    x[0, :512] = np.where(rng.integers(0, 2, 512), 1.0, -1.0)  # +-127 quants
    _check(w, x)


@needs_avx512
def test_prepare_gives_the_vbmi_kernel_on_the_file_bytes(monkeypatch):
    shape = (2, 4, 512)
    w = random_quantized(QT.IQ3_XXS, shape, np.random.default_rng(), 0.05)
    kept = L.prepare(QT.IQ3_XXS, shape, w, layout="gguf", simd=True)
    assert (kept.layout, kept.kernel) == ("gguf", K.K_IQ3_XXS_VBMI)
    monkeypatch.setenv("STRATA_CPU_SIMD", "avx2")
    assert L.prepare(QT.IQ3_XXS, shape, w, layout="gguf").kernel == K.K_IQ3_XXS_GATHER
    assert L.prepare(QT.IQ3_XXS, shape, w, layout="gguf", simd=False).kernel == K.K_IQ3_XXS


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
    from strata.cpu.kernels.simd import HAS_AVX512_VBMI
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


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="not x86-64")
def test_kernel_compiles_to_avx512_vbmi_vnni(tmp_path):
    """Compiled for Sapphire Rapids (avx512_asm): the block loop is zmm vpermt2b/vpermi2b,
    vpmultishiftqb and vpdpbusd, with no trap."""
    asm, ops = avx512_asm(tmp_path, "iq3_vbmi", "dot_iq3_xxs_vbmi", 98)
    for op in ("vpdpbusd", "vpshufb", "vpunpcklbw", "vpdpwssd"):
        assert op in ops, op
    assert {"vpermt2b", "vpermi2b"} & set(ops)
    assert "vpmultishiftqb" in asm and "kmovq" in asm


# ---------------------------------------------------------------- the kernel's own IR, run here

# The IR `iq3_vbmi.block_sum` builds, with its AVX-512 intrinsics swapped for generic IR of the
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


@pytest.fixture(scope="module")
def block_sum_ir():
    """ctypes function (uint8* block, int8* x) -> int32: the kernel's block IR, generic."""
    import ctypes

    from llvmlite import binding as llb
    from llvmlite import ir

    from strata.cpu.kernels.simd import I8, I32, Emit

    mod = ir.Module()
    mod.triple = llb.get_process_triple()
    p8 = I8.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(I32, [p8, p8]), "block_sum")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(V.block_sum(Emit(None, b), *fn.args))
    engine = jit_generic(mod, _RENAME, _GENERIC)
    f = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)(
        engine.get_function_address("block_sum")
    )
    yield f, engine


def test_kernel_ir_gives_the_reference_sums(block_sum_ir):
    """The IR the kernel is built from (not the NumPy model of it): every grid row, all and no
    signs, scales 0 and 15, +-127 activations, random blocks."""
    f = block_sum_ir[0]
    rng = np.random.default_rng()
    n = 64
    bl = rng.integers(0, 256, (n, 98), dtype=np.uint8)
    bl[:, 0:2] = 0
    bl[:4, 2:66] = np.arange(256, dtype=np.uint8).reshape(4, 64)
    bl[4, 66:98], bl[5, 66:98] = 0xFF, 0
    x = rng.integers(-127, 128, (n, 256)).astype(np.int8)
    x[4:8] = np.where(rng.integers(0, 2, (4, 256)), 127, -127)
    got = [f(bl[i].ctypes.data, x[i].ctypes.data) for i in range(n)]
    assert got == list(reference_blocks(bl, x))
