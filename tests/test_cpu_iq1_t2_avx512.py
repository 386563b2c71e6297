"""The AVX-512 kernel on IQ1_M's T2 layout (iq1/t2_avx512.py).

Everywhere (no AVX-512 needed): a NumPy emulation of its instructions, on the module's own
tables, equals a plain reference of the T2 block sum (random code bytes, every scale, both delta
signs, extreme activations) and `iq1.dot_iq1_m` on the GGUF bytes / `dot_t2_avx2` bit for bit
per row; the kernel's own block IR, its x86 intrinsics swapped for generic IR of the same
semantics, runs here and gives the reference sums; compiled for an AVX-512 CPU it has the
instructions it is written for and no trap. Where the host has every feature it uses: the
kernel itself against the portable and AVX2 kernels (bits) and gguf's dequantization.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
from gguf.quants import dequantize

from strata.cpu import layout as L
from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels.features import HAS_AVX2, avx512_enabled
from strata.cpu.kernels.iq1 import t2_avx2 as iq1_t2
from strata.cpu.kernels.iq1 import t2_avx512 as V
from strata.cpu.kernels.iq1.avx512 import M2_TAB
from strata.cpu.quantize import quantize_act
from strata.quant import activation as A
from strata.quant import random_quantized
from strata.quant.formats import QT
from tests.cpu_avx512_emu import (
    avx512_asm,
    jit_generic,
    needs_avx512,
    packssdw,
    pmaddwd,
    pmultishiftqb,
    vpdpbusd,
)
from tests.cpu_iq1_avx512_emu import _GENERIC, _RENAME, emulate_d, every_index_delta_and_scale
from tests.test_cpu_kernels import _activations, _gemv

BB = iq1_t2.BB

# ---------------------------------------------------------------- the instructions, in NumPy
# (arrays [N, bytes]: N super-blocks at once, one vector register per row)


def as_bytes(v):
    return np.ascontiguousarray(v).view(np.uint8)


def psrld(v, n):
    return as_bytes(as_bytes(v).view("<u4") >> np.uint32(n))


def emulate_blocks(codes, delta, scales, x, x8):
    """The kernel's int32 sum per super-block, instruction by instruction: codes uint8 [N, 64],
    delta uint8 [N, 4], scales uint8 [N, 8] (one T2 block's three planes), x int8 [N, 256] its
    activation quants, x8 int16 [N, 32] their sums of 8."""
    n = len(codes)
    dots = []
    for c in range(2):
        chunk = np.tile(codes[:, 32 * c : 32 * c + 32], 2)  # broadcast load
        for t in range(2):
            u = (psrld(chunk, 4) if t else chunk) & V.CODE_MASK  # vpsrld, vpandd
            xm = as_bytes(x[:, 64 * (2 * c + t) : 64 * (2 * c + t) + 64])  # memory operand
            dots.append(vpdpbusd(np.zeros((n, 16), np.int32), u, xm))
    sq = np.ascontiguousarray(np.tile(scales, 8))  # vpbroadcastq
    acc = np.zeros((n, 16), np.int32)
    for h in range(2):
        pu = packssdw(dots[2 * h], dots[2 * h + 1])
        ms = as_bytes(pmultishiftqb(V.SW_CTRL[h], sq)).view("<u2")
        sw = (ms & V.SW_MASK) | V.SW_OR  # vpternlogd
        acc += pmaddwd(pu, sw.view(np.int16))
    dq = np.ascontiguousarray(np.tile(delta, 16))  # vpbroadcastd
    ls = as_bytes(pmultishiftqb(V.LS_CTRL, sq)).view("<u2")
    dl = as_bytes(pmultishiftqb(V.DL_CTRL, dq)).view("<u2")
    m2 = M2_TAB[(((ls ^ dl) & 7) ^ dl) & 31]  # vpternlogd, vpermw
    acc += pmaddwd(x8, m2)
    return acc.sum(-1, dtype=np.int32)


def reference_blocks(codes, delta, scales, x, x8):
    """The T2 block sum as iq1_t2's docstring states it: per 16 weights with sc = 2 ls + 1,
    8 sc sum(u x) + sum over its two groups of sc (delta_g - 8) X8_g (int64)."""
    n = len(codes)
    c = codes.reshape(n, 2, 1, 32)
    u = ((c >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3).reshape(n, 256)
    words = np.ascontiguousarray(scales).view("<u2").astype(np.int64)  # [n, 4]
    s = np.arange(16)
    sc = 2 * ((words[:, s // 4] >> (3 * (s % 4))) & 7) + 1  # [n, 16]
    bits = np.ascontiguousarray(delta).view("<u4").astype(np.int64)  # [n, 1]
    dl = np.where((bits >> np.arange(32)) & 1, -1, 1)  # [n, 32]
    ux = (u.astype(np.int64) * x).reshape(n, 16, 16).sum(-1)
    off = ((dl - 8) * x8).reshape(n, 16, 2).sum(-1)
    return (sc * (8 * ux + off)).sum(-1)


def sums_of_8(x):
    return x.astype(np.int16).reshape(len(x), -1, 8).sum(-1, dtype=np.int16)


def random_planes(rng, n):
    """Random T2 planes of n blocks (every code byte, u = 3 too), every scale in each block
    position, both delta signs (and all set / none), as (codes, delta, scales)."""
    codes = rng.integers(0, 256, (n, 64), dtype=np.uint8)
    delta = rng.integers(0, 256, (n, 4), dtype=np.uint8)
    ls = ((np.arange(n * 16) + rng.integers(0, 8)) % 8).reshape(n, 4, 4).astype(np.uint16)
    words = (ls << (3 * np.arange(4, dtype=np.uint16))).sum(-1, np.uint16)
    words |= rng.integers(0, 16, (n, 4)).astype(np.uint16) << 12  # d nibbles: unused here
    scales = np.ascontiguousarray(words).view(np.uint8).reshape(n, 8)
    codes[:2], scales[:2] = 0xAA, 0xFF  # u = 2 everywhere, every scale 7
    delta[0], delta[1] = 0xFF, 0
    codes[2] = 0xFF  # u = 3 (no grid value gives it; the sums still agree)
    return codes, delta, scales


def extreme_activations(rng, n):
    x = rng.integers(-128, 128, (n, 256)).astype(np.int8)
    x[:4] = np.where(rng.integers(0, 2, (4, 256)), 127, -127)
    x[4], x[5], x[6] = 127, -127, -128
    return x


def emulate_row_dots(w, act):
    """dot_t2_avx512's result [n_act, rows]: the emulated block sums through the float steps
    of iq1_t2.dot_t2_avx2, in float32, in its order."""
    xq, xd, x8 = act[0], act[1], act[3]
    rows, nb = w.shape[0], w.shape[1] // BB
    codes = w[:, : 64 * nb].reshape(rows * nb, 64)
    delta = w[:, 64 * nb : 68 * nb].reshape(rows * nb, 4)
    scales = w[:, 68 * nb :].reshape(rows * nb, 8)
    gguf_like = np.zeros((rows * nb, 56), np.uint8)
    gguf_like[:, 48:56] = scales
    d = emulate_d(gguf_like).reshape(rows, nb)  # pext of the scale qword (iq1_avx512's test)
    y = np.zeros((xq.shape[0], rows), np.float32)
    for a in range(xq.shape[0]):
        xs = np.tile(xq[a, : 256 * nb].reshape(nb, 256), (rows, 1))
        s8 = np.tile(x8[a, : 32 * nb].reshape(nb, 32), (rows, 1))
        isum = emulate_blocks(codes, delta, scales, xs, s8).reshape(rows, nb)
        for r in range(rows):
            acc = np.float32(0.0)
            for b in range(nb):
                acc += np.float32(xd[a, b] * d[r, b]) * np.float32(isum[r, b]) * np.float32(0.125)
            y[a, r] = acc
    return y


def t2_rows(rng, rows, cols):
    """A T2 matrix from random IQ1_M with every grid index, both delta signs, every scale and
    random finite f16 d (subnormals included)."""
    w = random_quantized(QT.IQ1_M, (rows, cols), rng, 0.05)
    bl = w.reshape(-1, 56)
    every_index_delta_and_scale(bl, rng)
    d = rng.integers(0, 0x7C00, len(bl)) | (rng.integers(0, 2, len(bl)) << 15)
    words = bl[:, 48:56].copy().view("<u2")
    words[:] = (words & 0x0FFF) | (((d[:, None] >> (4 * np.arange(4))) & 15) << 12)
    bl[:, 48:56] = words.view(np.uint8)
    bl[:2, 48:56] |= np.array([0xFF, 0x0F] * 4, np.uint8)  # all scales 7, d kept
    bl[0, 32:48], bl[1, 32:48] = 0xFF, 0x77  # every delta negative / positive
    return iq1_t2.repack(w)


# ---------------------------------------------------------------- the emulation (any host)


def test_tables_state_the_layout():
    """Each vpdpbusd lane is one sub-block of 16 in natural order; each packed word's scale word
    is 8 (2 ls + 1) / f of that sub-block."""
    for m in range(4):  # code byte j of vector m (after the mask) is weight 64 m + j
        c, t = divmod(m, 2)
        plane = 2 * t + np.arange(64) // 32
        weight = 128 * c + 32 * plane + np.arange(64) % 32
        assert np.array_equal(weight, 64 * m + np.arange(64))
    assert np.array_equal(V.PACKED_SUB[0].reshape(4, 8)[:, 0], np.arange(4))
    ls = np.arange(8)
    for f, mask, bit in ((1, 0x70, 8), (4, 0x1C, 2)):
        assert np.array_equal(((ls << (4 if f == 1 else 2)) & mask) | bit, 8 * (2 * ls + 1) // f)


def test_emulated_block_sums_equal_the_reference():
    rng = np.random.default_rng()
    n = 1024
    planes = random_planes(rng, n)
    x = extreme_activations(rng, n)
    x8 = sums_of_8(x)
    got = emulate_blocks(*planes, x, x8)
    assert np.array_equal(got, reference_blocks(*planes, x, x8))


@pytest.mark.parametrize("cols", [256, 768, 2048])
def test_emulated_rows_equal_the_t2_kernels_bit_for_bit(cols):
    rng = np.random.default_rng()
    w = t2_rows(rng, 6, cols)
    act = quantize_act(_activations(rng, 5, cols), QT.Q8_K)
    got = emulate_row_dots(w, act).view(np.uint32)
    assert np.array_equal(got, _gemv(K.K_IQ1_M, iq1_t2.unpack(w), act, 5).view(np.uint32))
    if HAS_AVX2:
        assert np.array_equal(got, _gemv(K.K_IQ1_M_T2_AVX2, w, act, 5).view(np.uint32))


# ---------------------------------------------------------------- the kernel (hosts with it)


def _check(w, x):
    act = quantize_act(x, QT.Q8_K)
    n = x.shape[0]
    got = _gemv(K.K_IQ1_M_T2_AVX512, w, act, n)
    for code, rows in ((K.K_IQ1_M, iq1_t2.unpack(w)), (K.K_IQ1_M_T2_AVX2, w)):
        want = _gemv(code, rows, act, n)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), np.abs(got - want).max()
    wf = dequantize(iq1_t2.unpack(w), QT.IQ1_M).astype(np.float64)
    ref = A.roundtrip(x.astype(np.float64), QT.Q8_K) @ wf.T
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()


@needs_avx512
@pytest.mark.parametrize("cols", [256, 768, 2048])
def test_kernel_matches_t2_kernels_and_dequant(cols):
    rng = np.random.default_rng()
    w = iq1_t2.repack(random_quantized(QT.IQ1_M, (7, cols), rng, 0.05))
    _check(w, _activations(rng, 5, cols))


@needs_avx512
def test_kernel_every_grid_index_delta_scale_and_extreme():
    rng = np.random.default_rng()
    w = t2_rows(rng, 4, 256 * 32)
    x = _activations(rng, 5, 256 * 32)
    x[0, :512] = np.where(rng.integers(0, 2, 512), 1.0, -1.0)  # +-127 quants
    x[1, :512] = 1.0
    _check(w, x)


def test_prepare_gives_t2_the_avx512_kernel_where_enabled():
    shape = (2, 4, 512)
    w = random_quantized(QT.IQ1_M, shape, np.random.default_rng(), 0.05)
    m = L.prepare(QT.IQ1_M, shape, w, simd=True)
    want = K.K_IQ1_M_T2_AVX512 if avx512_enabled(True) else K.K_IQ1_M_T2_AVX2
    assert (m.layout, m.kernel) == ("t2", want)
    assert L.prepare(QT.IQ1_M, shape, w, simd=False).kernel == K.K_IQ1_M


def test_dispatch_maps_the_code_to_the_kernel():
    assert K.KERNELS[K.K_IQ1_M_T2_AVX512] is V.dot_t2_avx512
    assert L.KERNEL_TABLE["avx512"][QT.IQ1_M] == ("t2", K.K_IQ1_M_T2_AVX512)
    assert L.KERNEL_TABLE["avx2"][QT.IQ1_M] == ("t2", K.K_IQ1_M_T2_AVX2)


# ---------------------------------------------------------------- the code an AVX-512 CPU gets


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="not x86-64")
def test_kernel_compiles_to_avx512_vnni_without_activation_shuffles(tmp_path):
    """Compiled for Sapphire Rapids (avx512_asm): 4 vpdpbusd, 4 vpmultishiftqb, 2 vpackssdw,
    1 vpermw a block, pext for d, no trap, and nothing else on the shuffle port but the
    16-lane sum's extracts."""
    asm, ops = avx512_asm(tmp_path, "iq1.t2_avx512", "dot_t2_avx512", BB)
    assert ops.count("vpdpbusd") == 4 and ops.count("vpmultishiftqb") == 4
    assert ops.count("vpackssdw") == 2 and ops.count("vpermw") == 1
    assert ops.count("vpmaddwd") + ops.count("vpdpwssd") == 3
    for op in ("vpshufb", "vpermb", "vpermt2b", "vpermi2b", "vshufi64x2", "vinserti64x4"):
        assert op not in ops, op
    assert "vinserti32x8" not in ops and "vpgatherdd" not in ops
    assert ops.count("vbroadcasti64x4") + ops.count("vbroadcasti32x8") == 2  # code chunks
    assert "pext" in asm


# ---------------------------------------------------------------- the kernel's own IR, run here
# (iq1_t2_avx512.block_sum with its AVX-512 intrinsics swapped for the generic IR of
# cpu_iq1_avx512_emu, which was written from Intel's definitions)


def generic_fn(emit, ret, args, cret, cargs, rename=_RENAME, generic=_GENERIC, features=""):
    """(ctypes function, engine): one IR function of type ret(args) whose body returns
    emit(Emit, *its arguments), its AVX-512 intrinsics swapped for generic IR (`jit_generic`),
    called through ctypes as cret(cargs). Keep the engine alive while calling."""
    import ctypes

    from llvmlite import binding as llb
    from llvmlite import ir

    from strata.cpu.kernels.simd import Emit

    mod = ir.Module()
    mod.triple = llb.get_process_triple()
    fn = ir.Function(mod, ir.FunctionType(ret, args), "fn")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(emit(Emit(None, b), *fn.args))
    engine = jit_generic(mod, rename, generic, "llvm.x86.avx", features=features)
    return ctypes.CFUNCTYPE(cret, *cargs)(engine.get_function_address("fn")), engine


@pytest.fixture(scope="module")
def block_ir():
    """ctypes function (codes, delta, scales, x, x8 pointers) -> int32: the block IR, generic."""
    import ctypes

    from strata.cpu.kernels.simd import I8, I32

    yield generic_fn(V.block_sum, I32, [I8.as_pointer()] * 5, ctypes.c_int32, [ctypes.c_void_p] * 5)


def test_kernel_ir_gives_the_reference_sums(block_ir):
    """The IR the kernel is built from (not the NumPy model of it)."""
    f = block_ir[0]
    rng = np.random.default_rng()
    n = 96
    planes = [np.ascontiguousarray(p) for p in random_planes(rng, n)]
    x = extreme_activations(rng, n)
    x8 = sums_of_8(x)
    arrays = (*planes, x, x8)
    got = [f(*(a[i].ctypes.data for a in arrays)) for i in range(n)]
    assert got == list(reference_blocks(*planes, x, x8))
