"""IQ3_XXS repacked position-major ("pm", iq3/pm_avx512.py).

Everywhere: the repack is lossless and refuses broken sign parity; the quantizer's
position-major quants are xq's reordered; AVX-512 VBMI + VNNI hosts take pm for IQ3_XXS; the
kernel's own block IR, its x86 intrinsics swapped for generic IR (cpu_avx512_emu), gives the
reference block sums; compiled for Sapphire Rapids it is vpermb and VNNI with no trap and no
unpack shuffles. Where the host has AVX-512 VBMI + VNNI: the kernel itself against the portable
IQ3_XXS kernel on the GGUF bytes, bit for bit.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest

from strata.cpu import layout as L
from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels.features import avx512_enabled
from strata.cpu.kernels.iq3 import pm_avx512 as P
from strata.cpu.quantize import quantize_act
from strata.quant import random_quantized
from strata.quant.formats import QT
from tests.cpu_avx512_emu import (
    _GENERIC,
    _RENAME,
    avx512_asm,
    edge_blocks,
    jit_generic,
    needs_avx512,
    reference_blocks,
)
from tests.test_cpu_kernels import _activations, _gemv


def test_repack_is_lossless_and_refuses_broken_parity():
    rng = np.random.default_rng()
    for w in (random_quantized(QT.IQ3_XXS, (9, 768), rng, 0.05), edge_blocks(rng)):
        rows = w.reshape(w.shape[0], -1)
        p = P.repack(rows)
        assert p.shape == (rows.shape[0], rows.shape[1] // 98 * 102)
        np.testing.assert_array_equal(P.unpack(p), rows)
    p[0, P.SIGN_OFF] ^= 1  # one sign flipped: its byte's parity no longer holds
    with pytest.raises(ValueError, match="parity"):
        P.unpack(p)
    with pytest.raises(ValueError, match="98-byte blocks"):
        P.repack(np.zeros((2, 97), np.uint8))


def test_quantizer_writes_the_position_major_quants():
    rng = np.random.default_rng()
    xq, *_, xf = quantize_act(_activations(rng, 5, 1024), QT.Q8_K)
    xp = xf.view(np.int8)[:, :1024].reshape(5, 4, 256)
    want = xq.reshape(5, 4, 256)[:, :, P.PERM]
    np.testing.assert_array_equal(xp, want)


def test_avx512_hosts_take_pm_for_iq3_xxs():
    shape = (2, 4, 512)
    w = random_quantized(QT.IQ3_XXS, shape, np.random.default_rng(), 0.05)
    assert L.KERNEL_TABLE["avx512"][QT.IQ3_XXS] == ("pm", K.K_IQ3_XXS_PM_AVX512)
    m = L.prepare(QT.IQ3_XXS, shape, w)
    if avx512_enabled():
        assert m.layout == "pm" and m.nbytes == m.gguf_bytes * 102 // 98
        assert m.kernel == K.K_IQ3_XXS_PM_AVX512
    np.testing.assert_array_equal(m.gguf_rows(), w.reshape(8, -1))


# ---------------------------------------------------------------- the kernel's IR, run here

_PERMVAR = (
    """
define internal <64 x i8> @generic.permvar(<64 x i8> %t, <64 x i8> %idx) {
  %m = and <64 x i8> %idx, <i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63,
    i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63,
    i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63,
    i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63,
    i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63, i8 63,
    i8 63, i8 63, i8 63>
"""
    + "".join(
        f"  %j{i} = extractelement <64 x i8> %m, i32 {i}\n"
        f"  %v{i} = extractelement <64 x i8> %t, i8 %j{i}\n"
        f"  %r{i} = insertelement <64 x i8> {'poison' if i == 0 else f'%r{i - 1}'}, "
        f"i8 %v{i}, i32 {i}\n"
        for i in range(64)
    )
    + "  ret <64 x i8> %r63\n}\n"
)


@pytest.fixture(scope="module")
def pm_ir():
    """block sum (u8* block, i8* xp) -> int32: the pm kernel's block IR with generic twins of
    its intrinsics, JIT-compiled for this host."""
    from llvmlite import binding as llb
    from llvmlite import ir

    from strata.cpu.kernels.simd import I8, I32, Emit

    mod = ir.Module()
    mod.triple = llb.get_process_triple()
    p8 = I8.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(I32, [p8, p8]), "pm_sum")
    b = ir.IRBuilder(fn.append_basic_block())
    e = Emit(None, b)
    b.ret(e._call("llvm.vector.reduce.add.v16i32", I32, [P.block_acc(e, *fn.args)]))
    rename = dict(_RENAME, **{"llvm.x86.avx512.permvar.qi.512": "generic.permvar"})
    engine = jit_generic(mod, rename, _GENERIC + _PERMVAR)
    f = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p)(
        engine.get_function_address("pm_sum")
    )
    yield f, engine


def test_kernel_ir_gives_the_reference_sums(pm_ir):
    f = pm_ir[0]
    rng = np.random.default_rng()
    w = edge_blocks(rng, 2, 8)
    bl = w.reshape(-1, 98)
    n = bl.shape[0]
    x = rng.integers(-127, 128, (n, 256)).astype(np.int8)
    x[:4] = np.where(rng.integers(0, 2, (4, 256)), 127, -127)
    pm = P.repack(bl)  # one block a row
    xp = np.ascontiguousarray(x[:, P.PERM])
    got = [f(pm[i].ctypes.data, xp[i].ctypes.data) for i in range(n)]
    assert got == list(reference_blocks(bl, x))


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="not x86-64")
def test_kernel_compiles_to_vpermb_and_vnni(tmp_path):
    asm, ops = avx512_asm(tmp_path, "iq3.pm_avx512", "dot_pm_avx512", 102)
    for op in ("vpermb", "vpdpbusd", "vpdpwssd", "vpackssdw"):
        assert op in ops, op
    assert {"vpermt2b", "vpermi2b"} & set(ops)
    assert not {"vpunpcklbw", "vpunpckhbw", "vpmultishiftqb"} & set(ops)


# ---------------------------------------------------------------- the kernel (hosts with it)


@needs_avx512
@pytest.mark.parametrize("cols", [256, 768, 1024, 2048, 2304])
def test_kernel_matches_the_portable_kernels(cols):
    rng = np.random.default_rng()
    for w in (
        random_quantized(QT.IQ3_XXS, (7, cols), rng, 0.05),
        edge_blocks(rng, 3, cols // 256),
    ):
        rows = w.reshape(w.shape[0], -1)
        x = _activations(rng, 5, cols)
        x[0, : min(cols, 512)] = np.where(rng.integers(0, 2, min(cols, 512)), 1.0, -1.0)
        act = quantize_act(x, QT.Q8_K)
        got = _gemv(K.K_IQ3_XXS_PM_AVX512, P.repack(rows), act, 5)
        want = _gemv(K.K_IQ3_XXS, rows, act, 5)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
