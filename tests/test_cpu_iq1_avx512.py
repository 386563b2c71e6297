"""The AVX-512 IQ1_M kernel on the GGUF bytes (iq1_avx512.py).

Everywhere (no AVX-512 needed): a NumPy emulation of its instructions, on the module's own
tables, equals the `iq1.terms` reference per super-block (every grid row, both delta signs,
every scale) and `iq1.dot_iq1_m` bit for bit per row (random f16 d too); the kernel's own block
IR, its x86 intrinsics swapped for generic IR of the same semantics, runs here and gives the
reference sums; compiled for an AVX-512 CPU it has the instructions it is written for and no
trap. Where the host has every feature it uses: the kernel itself against the portable kernel
(bits) and gguf's dequantization.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
from gguf.quants import dequantize

from strata.cpu import layout as L
from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels import iq1
from strata.cpu.kernels import iq1_avx512 as V
from strata.cpu.kernels.simd import FEATURES
from strata.cpu.kernels.tables import IQ1S_GRID
from strata.cpu.quantize import quantize_act
from strata.quant import activation as A
from strata.quant import random_quantized
from strata.quant.formats import QT
from tests.test_cpu_iq3_vbmi import (
    _DPBUSD,
    _PACKSSDW,
    _PMADDWD,
    _vec,
    avx512_asm,
    jit_generic,
    needs_avx512,
    packssdw,
    pmaddwd,
    pmultishiftqb,
    vpdpbusd,
)
from tests.test_cpu_kernels import _activations, _gemv

# ---------------------------------------------------------------- the instructions, in NumPy
# (arrays [N, bytes]: N super-blocks at once, one vector register per row; the ones iq3_vbmi
# also uses come from its test)


def dwords(v):
    return np.ascontiguousarray(v).view("<u4")


def as_bytes(v):
    return np.ascontiguousarray(v).view(np.uint8)


def emulate_blocks(bl, x, x8):
    """The kernel's int32 sum per super-block, instruction by instruction: bl uint8 [N, 56]
    blocks, x int8 [N, 256] their activation quants, x8 int16 [N, 32] its sums of 8."""
    n = len(bl)
    p = np.ascontiguousarray(bl[:, V.PSEL])  # vpermt2b of bytes 0..31 and 24..55
    xd = dwords(x)  # [N, 64]
    accs = []
    for h in range(2):
        idx = dwords(pmultishiftqb(V.IDX_CTRL[h], p)) & 0x7FF
        g = V.GRID_NIB[idx]  # vpgatherdd
        lo, hi = g & 0x0F0F0F0F, (g >> 4) & 0x0F0F0F0F
        xq = xd[:, 32 * h : 32 * h + 32]  # the two natural 64-byte vectors, as 32 dwords
        xl, xh = xq[:, V.X_LO], xq[:, V.X_HI]  # vshufps
        acc = vpdpbusd(np.zeros((n, 16), np.int32), as_bytes(lo), as_bytes(xl))
        accs.append(vpdpbusd(acc, as_bytes(hi), as_bytes(xh)))
    pu = packssdw(*accs)
    sq = np.ascontiguousarray(np.tile(bl[:, 48:56], 8))  # vpbroadcastq
    m1 = (as_bytes(pmultishiftqb(V.M1_CTRL, sq)).view("<u2") & 0x70) | 8
    ls = as_bytes(pmultishiftqb(V.LS_CTRL, sq)).view("<u2")
    dl = as_bytes(pmultishiftqb(V.DL_CTRL, p)).view("<u2")
    m2 = V.M2_TAB[((ls & 7) | (dl & ~np.uint16(7))) & 31]  # vpternlogd, vpermw
    acc = pmaddwd(pu, m1.view(np.int16)) + pmaddwd(x8, m2)
    return acc.sum(-1, dtype=np.int32)


def emulate_d(bl):
    """pext of the scale qword with 0xF000F000F000F000, as the f16 it is, in float32."""
    q = np.ascontiguousarray(bl[:, 48:56]).view("<u8")[:, 0]
    bits = sum(
        ((q >> np.uint64(16 * k + 12)) & np.uint64(15)) << np.uint64(4 * k) for k in range(4)
    )
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def reference_blocks(bl, x):
    """sum over the block of (2 ls + 1)(8 g + delta) x, from iq1.terms."""
    ((_, sw, _),) = iq1.terms(bl)
    return (sw * x.astype(np.int64)).sum(-1)


def sums_of_8(x):
    return x.astype(np.int16).reshape(len(x), -1, 8).sum(-1, dtype=np.int16)


def emulate_row_dots(w, act):
    """dot_iq1_m_avx512's result [n_act, rows]: the emulated block sums through the float steps
    of iq1.dot_iq1_m, in float32, in its order."""
    xq, xd, x8 = act[0], act[1], act[3]
    rows, nb = w.shape[0], w.shape[1] // 56
    bl = w.reshape(rows * nb, 56)
    d = emulate_d(bl).reshape(rows, nb)
    y = np.zeros((xq.shape[0], rows), np.float32)
    for a in range(xq.shape[0]):
        xs = np.tile(xq[a, : 256 * nb].reshape(nb, 256), (rows, 1))
        s8 = np.tile(x8[a, : 32 * nb].reshape(nb, 32), (rows, 1))
        isum = emulate_blocks(bl, xs, s8).reshape(rows, nb)
        for r in range(rows):
            acc = np.float32(0.0)
            for b in range(nb):
                acc += np.float32(xd[a, b] * d[r, b]) * np.float32(isum[r, b]) * np.float32(0.125)
            y[a, r] = acc
    return y


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


def test_tables_state_the_layout():
    """GRID_NIB holds every grid row as u = g + 1 nibbles; the lane order makes XL / XH in-lane
    vshufps of the natural activation vectors; the M2 table has two copies."""
    u = (V.GRID_NIB[:, None] >> (4 * np.array([0, 2, 4, 6, 1, 3, 5, 7]))) & 15
    assert np.array_equal(u.astype(np.int64) - 1, IQ1S_GRID)
    assert sorted(V.GROUPS) == list(range(16))
    for src in (V.X_LO, V.X_HI):  # per 128-bit lane k: (a0, a2, b0, b2) or (a1, a3, b1, b3)
        lane = np.array(src).reshape(4, 4) - 4 * np.arange(4)[:, None]
        assert (lane[:, :2] < 4).all() and ((lane[:, 2:] >= 16) & (lane[:, 2:] < 20)).all()
    assert np.array_equal(V.M2_TAB[:16], V.M2_TAB[16:])


def test_emulated_block_sums_equal_the_reference():
    """Every grid index, both delta signs, every scale; random blocks; +-127 activations."""
    rng = np.random.default_rng()
    n = 512
    bl = rng.integers(0, 256, (n, 56), dtype=np.uint8)
    every_index_delta_and_scale(bl[:128], rng)
    bl[:, 49:56:2] &= 0x0F  # d = 0 (not used by the sums; random bits may be NaN)
    bl[128:130, 48:56] = 0xFF  # scales 7, all deltas negative / none
    bl[128, 32:48], bl[129, 32:48] = 0xFF, 0x77
    x = rng.integers(-127, 128, (n, 256)).astype(np.int8)
    x[128:136] = np.where(rng.integers(0, 2, (8, 256)), 127, -127)
    x[130:132] = 127
    got = emulate_blocks(bl, x, sums_of_8(x))
    assert np.array_equal(got, reference_blocks(bl, x))


def test_emulated_d_is_the_portable_one():
    rng = np.random.default_rng()
    bl = rng.integers(0, 256, (4096, 56), dtype=np.uint8)
    want = np.array([iq1.iq1m_d(bl, i, 0) for i in range(len(bl))], np.float32)
    got = emulate_d(bl)
    nan = np.isnan(want)  # NumPy quiets a signalling NaN's payload on widening, LLVM keeps it
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("cols", [256, 768, 2048])
def test_emulated_rows_equal_the_portable_kernel_bit_for_bit(cols):
    rng = np.random.default_rng()
    w = random_quantized(QT.IQ1_M, (6, cols), rng, 0.05)
    bl = w.reshape(-1, 56)
    every_index_delta_and_scale(bl[: len(bl) // 2], rng)
    # random finite f16 d (subnormals included) in the scale words' top nibbles
    d = rng.integers(0, 0x7C00, len(bl)) | (rng.integers(0, 2, len(bl)) << 15)
    words = bl[:, 48:56].copy().view("<u2")
    words[:] = (words & 0x0FFF) | (((d[:, None] >> (4 * np.arange(4))) & 15) << 12)
    bl[:, 48:56] = words.view(np.uint8)
    act = quantize_act(_activations(rng, 5, cols), QT.Q8_K)
    got = emulate_row_dots(w, act)
    want = _gemv(K.K_IQ1_M, w, act, 5)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


# ---------------------------------------------------------------- the kernel (hosts with it)


def _check(w, x):
    act = quantize_act(x, QT.Q8_K)
    got = _gemv(K.K_IQ1_M_AVX512, w, act, x.shape[0])
    want = _gemv(K.K_IQ1_M, w, act, x.shape[0])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), np.abs(got - want).max()
    ref = A.roundtrip(x.astype(np.float64), QT.Q8_K) @ dequantize(w, QT.IQ1_M).astype(np.float64).T
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()


@needs_avx512
@pytest.mark.parametrize("cols", [256, 768, 2048])
def test_kernel_matches_portable_kernel_and_dequant(cols):
    rng = np.random.default_rng()
    _check(random_quantized(QT.IQ1_M, (7, cols), rng, 0.05), _activations(rng, 5, cols))


@needs_avx512
def test_kernel_every_grid_index_delta_scale_and_extreme():
    rng = np.random.default_rng()
    w = random_quantized(QT.IQ1_M, (4, 256 * 32), rng, 0.05)
    bl = w.reshape(-1, 56)  # [128 blocks, 56]
    every_index_delta_and_scale(bl, rng)
    bl[:2, 48:56] |= np.array([0xFF, 0x0F] * 4, np.uint8)  # all scales 7, d kept
    bl[0, 32:48], bl[1, 32:48] = 0xFF, 0x77  # every delta negative / positive
    x = _activations(rng, 5, 256 * 32)
    x[0, :512] = np.where(rng.integers(0, 2, 512), 1.0, -1.0)  # +-127 quants
    x[1, :512] = 1.0
    _check(w, x)


@needs_avx512
def test_prepare_gives_the_avx512_kernel_on_the_file_bytes(monkeypatch):
    shape = (2, 4, 512)
    w = random_quantized(QT.IQ1_M, shape, np.random.default_rng(), 0.05)
    kept = L.prepare(QT.IQ1_M, shape, w, layout="gguf", simd=True)
    assert (kept.layout, kept.kernel) == ("gguf", K.K_IQ1_M_AVX512)
    assert L.prepare(QT.IQ1_M, shape, w, layout="auto", simd=True).layout == "t2"
    monkeypatch.setenv("STRATA_CPU_LAYOUT", "IQ1_M=gguf")
    assert L.prepare(QT.IQ1_M, shape, w, simd=True).kernel == K.K_IQ1_M_AVX512
    monkeypatch.setenv("STRATA_CPU_SIMD", "avx2")
    assert L.prepare(QT.IQ1_M, shape, w, layout="gguf").kernel == K.K_IQ1_M_GATHER
    assert L.prepare(QT.IQ1_M, shape, w, layout="gguf", simd=False).kernel == K.K_IQ1_M


def test_avx512_hosts_map_iq1_m_gguf_to_the_kernel():
    assert K.AVX512_GGUF[QT.IQ1_M] == K.K_IQ1_M_AVX512
    assert K.KERNELS[K.K_IQ1_M_AVX512] is V.dot_iq1_m_avx512
    assert QT.IQ1_M not in L.AUTO_GGUF


# ---------------------------------------------------------------- the code an AVX-512 CPU gets


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="not x86-64")
def test_kernel_compiles_to_avx512_gathers_and_vnni(tmp_path):
    """Compiled for Sapphire Rapids (avx512_asm): two zmm vpgatherdd a block, vpermt2b /
    vpmultishiftqb / vpermw, vpdpbusd, pext for d, no trap, and the scale qword loaded (not
    pulled out of a vector)."""
    asm, ops = avx512_asm(tmp_path, "iq1_avx512", "dot_iq1_m_avx512", 56)
    assert ops.count("vpgatherdd") == 2
    assert ops.count("vpdpbusd") == 4 and ops.count("vpmultishiftqb") == 5
    for op in ("vpermw", "vpackssdw", "vpmaddwd", "vpsrld", "vpternlogd"):
        assert op in ops, op
    assert {"vpermt2b", "vpermi2b"} & set(ops)
    assert "pext" in asm and "vpextrq" not in asm


# ---------------------------------------------------------------- the kernel's own IR, run here

# `iq1_avx512.block_sum`'s IR with its AVX-512 intrinsics swapped for generic IR of their
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


@pytest.fixture(scope="module")
def block_ir():
    """ctypes functions (uint8* block, int8* x, int16* x8) -> int32 (the kernel's block IR,
    generic) and (uint8* block) -> uint16 (its d bits, where the host has bmi2)."""
    import ctypes

    from llvmlite import binding as llb
    from llvmlite import ir

    from strata.cpu.kernels.simd import I8, I16, I32, Emit

    mod = ir.Module()
    mod.triple = llb.get_process_triple()
    p8 = I8.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(I32, [p8, p8, p8]), "block_sum")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(V.block_sum(Emit(None, b), *fn.args))
    fd = ir.Function(mod, ir.FunctionType(I16, [p8]), "d_bits")
    b = ir.IRBuilder(fd.append_basic_block())
    b.ret(V.d_bits(Emit(None, b), fd.args[0]))
    bmi2 = ",".join("+" + f for f in sorted(FEATURES) if f == "bmi2")
    engine = jit_generic(mod, _RENAME, _GENERIC, "llvm.x86.avx", features=bmi2)
    vp = ctypes.c_void_p
    f = ctypes.CFUNCTYPE(ctypes.c_int32, vp, vp, vp)(engine.get_function_address("block_sum"))
    d = ctypes.CFUNCTYPE(ctypes.c_uint16, vp)(engine.get_function_address("d_bits"))
    yield f, d, engine


def test_kernel_ir_gives_the_reference_sums(block_ir):
    """The IR the kernel is built from (not the NumPy model of it): every grid index, both delta
    signs, every scale, +-127 activations, random blocks."""
    f = block_ir[0]
    rng = np.random.default_rng()
    n = 96
    bl = rng.integers(0, 256, (n, 56), dtype=np.uint8)
    every_index_delta_and_scale(bl[:64], rng)
    bl[64, 48:56], bl[64, 32:48] = 0xFF, 0xFF
    bl[:, 49:56:2] &= 0x0F  # d = 0 (not used by the sums; random bits may be NaN)
    x = rng.integers(-127, 128, (n, 256)).astype(np.int8)
    x[64:68] = np.where(rng.integers(0, 2, (4, 256)), 127, -127)
    x8 = sums_of_8(x)
    got = [f(bl[i].ctypes.data, x[i].ctypes.data, x8[i].ctypes.data) for i in range(n)]
    assert got == list(reference_blocks(bl, x))


def test_kernel_ir_d_bits_are_the_f16_of_the_portable_kernel(block_ir):
    d = block_ir[1]
    bl = np.random.default_rng().integers(0, 256, (256, 56), dtype=np.uint8)
    got = np.array([d(bl[i].ctypes.data) for i in range(len(bl))], np.uint16)
    w = bl[:, 48:56].copy().view("<u2").astype(np.uint16)  # iq1m_d's nibbles, in NumPy
    want = (w[:, 0] >> 12) | ((w[:, 1] >> 8) & 0xF0) | ((w[:, 2] >> 4) & 0xF00) | (w[:, 3] & 0xF000)
    assert np.array_equal(got, want)
