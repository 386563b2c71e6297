"""IQ1_M's T7 layout (iq1_t7.py: 7-bit ternary quads) and its AVX-512 kernel (iq1_t7_avx512.py).

Everywhere: the Numba repack equals its NumPy statement and is lossless (every grid index,
both delta signs, every scale), `unpack` refuses quads that are not four ternary digits; the
decode's tables, run as NumPy instructions, give each weight's code in natural order; the
portable kernel is bit-identical to the portable kernel on the GGUF bytes and close to gguf's
dequantization times the float64 activation; the AVX-512 kernel's own block IR, its intrinsics
swapped for generic IR, gives the T2 reference sums of the same blocks; compiled for an AVX-512
CPU it has the instructions it is written for and no trap. Where the host has the features: the
kernel itself against the portable kernels (bits) and the dequantization.
"""

from __future__ import annotations

import ctypes
import functools
import platform

import numpy as np
import pytest
from gguf.quants import dequantize

from strata.cpu import layout as L
from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels import iq1_t2, iq1_t7
from strata.cpu.kernels import iq1_t2_avx512 as T2V
from strata.cpu.kernels import iq1_t7_avx512 as V
from strata.cpu.kernels.iq1_t2_avx512 import row_fv
from strata.cpu.kernels.simd import FEATURES, I8, I32, I64, avx512_enabled
from strata.cpu.quantize import quantize_act
from strata.quant import activation as A
from strata.quant import random_quantized
from strata.quant.formats import QT
from tests.test_cpu_iq1_avx512 import _GENERIC, _RENAME, every_index_delta_and_scale
from tests.test_cpu_iq1_t2_avx512 import (
    extreme_activations,
    generic_fn,
    reference_blocks,
    sums_of_8,
)
from tests.test_cpu_iq3_vbmi import (
    _PERMI2B,
    avx512_asm,
    needs_avx512,
    pmultishiftqb,
    vpermi2b,
)
from tests.test_cpu_kernels import _activations, _gemv

BB = iq1_t7.BB


def edge_iq1_m(rng, rows, cols):
    """Random IQ1_M rows whose blocks cover every grid index, both delta signs, every scale."""
    w = random_quantized(QT.IQ1_M, (rows, cols), rng, 0.05)
    every_index_delta_and_scale(w.reshape(-1, 56), rng)
    return w


# ---------------------------------------------------------------- the layout


@pytest.mark.parametrize("cols", [256, 2048, 256 * 9])
def test_repack_is_its_numpy_statement_and_lossless(cols):
    rng = np.random.default_rng()
    w = edge_iq1_m(rng, 11, cols)
    p = iq1_t7.repack(w)
    assert p.shape == (11, cols // 256 * BB)
    assert np.array_equal(p, iq1_t7.repack_reference(w))
    assert np.array_equal(iq1_t7.unpack(p), w)


def test_unpack_refuses_what_no_iq1_m_block_gives():
    rng = np.random.default_rng()
    p = iq1_t7.repack(edge_iq1_m(rng, 2, 512))
    bad = p.copy()
    bad[1, 56:63] = 0xFF  # block 1's quads 0..7 = 127
    with pytest.raises(ValueError, match="above 80"):
        iq1_t7.unpack(bad)
    missing = np.flatnonzero(iq1_t2._grid_index() < 0)[0]  # 8 ternary values no grid row has
    u = iq1_t2.gguf_codes(iq1_t7.unpack(p[:1]))[0][0, 0].copy()
    u[:8] = (missing // 3 ** np.arange(8)) % 3  # group 0 of row 0's first block
    q = (u.reshape(4, 64).astype(np.int64) * iq1_t7.P3[:, None]).sum(0)
    bits = ((q[:, None] >> np.arange(7)) & 1).astype(np.uint8).ravel()
    bad = p.copy()
    bad[0, :56] = np.packbits(bits, bitorder="little")
    with pytest.raises(ValueError, match="not an iq1s grid entry"):
        iq1_t7.unpack(bad)


def test_decode_tables_give_natural_order():
    """SPREAD (vpermb), QUAD_CTRL (vpmultishiftqb), PACKED (vpermi2b), then the masks and the
    dword shift, run as the NumPy instructions: digit vector k byte j is u of weight 64 k + j,
    times WORD_F's factor of its pack half."""
    rng = np.random.default_rng()
    w = edge_iq1_m(rng, 4, 256 * 8)
    p = iq1_t7.repack(w)
    nb = w.shape[1] // 56
    u = iq1_t2.gguf_codes(w)[0].reshape(-1, 256)
    # each block's 56 quad bytes and the 8 after them (a 64-byte load inside the row)
    padded = np.concatenate([p, np.zeros((p.shape[0], 8), np.uint8)], axis=1)
    loads = np.stack([padded[:, 56 * b : 56 * b + 64] for b in range(nb)], 1).reshape(-1, 64)
    quads = pmultishiftqb(V.QUAD_CTRL, np.ascontiguousarray(loads[:, V.SPREAD]))
    codes = vpermi2b(iq1_t7.PACKED[:64], quads, iq1_t7.PACKED[64:])
    for k in range(4):
        v = (codes.view("<u4") >> 4).view(np.uint8) if k >= 2 else codes  # vpsrld
        f = 1 if k % 2 == 0 else 4
        assert np.array_equal(v & (3 * f), u[:, 64 * k : 64 * k + 64] * f)
    assert list(V.WORD_F[:8]) == [1] * 4 + [4] * 4  # vpackssdw: digits 2 h, 2 h + 1 per lane


# ---------------------------------------------------------------- the portable kernel


@pytest.mark.parametrize("cols", [256, 768, 2048])
def test_portable_kernel_is_the_gguf_kernel_bit_for_bit(cols):
    rng = np.random.default_rng()
    w = edge_iq1_m(rng, 6, cols)
    x = _activations(rng, 5, cols)
    act = quantize_act(x, QT.Q8_K)
    got = _gemv(K.K_IQ1_M_T7, iq1_t7.repack(w), act, 5)
    assert np.array_equal(got.view(np.uint32), _gemv(K.K_IQ1_M, w, act, 5).view(np.uint32))
    ref = A.roundtrip(x.astype(np.float64), QT.Q8_K) @ dequantize(w, QT.IQ1_M).astype(np.float64).T
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()


# ---------------------------------------------------------------- the kernel's own IR, run here


_RENAME7 = dict(_RENAME, **{"llvm.x86.avx512.vpermi2var.qi.512": "generic.vpermi2b"})


@pytest.fixture(scope="module")
def block_ir():
    """ctypes function (quads, delta, scales, x, x8 pointers) -> int32: the block IR, generic."""
    vp = ctypes.c_void_p
    yield generic_fn(
        V.block_sum, I32, [I8.as_pointer()] * 5, ctypes.c_int32, [vp] * 5, _RENAME7,
        _GENERIC + _PERMI2B,
    )  # fmt: skip


def test_kernel_ir_gives_the_t2_reference_sums(block_ir):
    """The IR the kernel is built from, on T7 blocks, against T2's reference block sum of the
    same IQ1_M blocks (extreme activations included)."""
    f = block_ir[0]
    rng = np.random.default_rng()
    n = 64
    w = edge_iq1_m(rng, n, 256)  # one block a row
    p7, p2 = iq1_t7.repack(w), iq1_t2.repack(w)
    quads = np.ascontiguousarray(p7[:, :64])  # the 56 quad bytes and 8 beyond (the planes)
    delta, scales = (np.ascontiguousarray(p7[:, a:b]) for a, b in ((56, 60), (60, 68)))
    x = extreme_activations(rng, n)
    x8 = sums_of_8(x)
    arrays = (quads, delta, scales, x, x8)
    got = [f(*(a[i].ctypes.data for a in arrays)) for i in range(n)]
    want = reference_blocks(p2[:, :64], p2[:, 64:68], p2[:, 68:76], x, x8)
    assert got == list(want)


# the float-lane row kernels (`iq1_t2_avx512.row_fv`) of both ternary layouts
FV = {
    "t7": (iq1_t7.repack, V.block_sum, 56, K.K_IQ1_M_T7_AVX512_FV),
    "t2": (iq1_t2.repack, T2V.block_sum, 64, K.K_IQ1_M_T2_AVX512_FV),
}


@pytest.fixture(scope="module")
def row_ir():
    """{layout: ctypes function (row, nb, x quants, sums of 8, block scales) -> float32}: the
    float-lane row kernel's IR for T7 and T2, AVX-512 intrinsics generic (and the engines)."""
    from llvmlite import ir

    vp = ctypes.c_void_p
    p8 = I8.as_pointer()
    feats = ",".join("+" + f for f in sorted(FEATURES) if f in ("bmi2", "f16c"))
    out = {}
    for lay, (_, blk, code_bytes, _) in FV.items():
        out[lay] = generic_fn(
            functools.partial(_row_fv_of, blk, code_bytes), ir.FloatType(),
            [p8, I64, p8, p8, p8], ctypes.c_float, [vp, ctypes.c_int64, vp, vp, vp], _RENAME7,
            _GENERIC + _PERMI2B, feats,
        )  # fmt: skip
    yield out


def _row_fv_of(blk, code_bytes, e, pw, nb, px, p8, pxd):
    return row_fv(e, blk, code_bytes, pw, nb, px, p8, pxd)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="not x86-64")
@pytest.mark.parametrize("lay", list(FV))
@pytest.mark.parametrize("cols", [256, 768, 2048])
def test_float_lane_row_ir_is_close_and_deterministic(row_ir, lay, cols):
    """The float-lane row kernel's IR (one loop over the row's blocks) against the bit-exact
    kernel on the GGUF bytes: within 2e-6 of the row scale, the same bits on a second call."""
    f = row_ir[lay][0]
    rng = np.random.default_rng()
    w = edge_iq1_m(rng, 6, cols)
    p = FV[lay][0](w)
    act = quantize_act(_activations(rng, 5, cols), QT.Q8_K)
    want = _gemv(K.K_IQ1_M, w, act, 5)
    xq, xd, x8 = (np.ascontiguousarray(act[i]) for i in (0, 1, 3))
    nb = cols // 256

    def call(r, a):
        return f(p[r].ctypes.data, nb, xq[a].ctypes.data, x8[a].ctypes.data, xd[a].ctypes.data)

    got = np.array([[call(r, a) for r in range(6)] for a in range(5)], np.float32)
    assert np.abs(got - want).max() <= 2e-6 * np.abs(want).max()
    assert np.float32(call(5, 4)).view(np.uint32) == got[4, 5].view(np.uint32)


# ---------------------------------------------------------------- the kernel (hosts with it)


def _check(w, x):
    act = quantize_act(x, QT.Q8_K)
    n = x.shape[0]
    p = iq1_t7.repack(w)
    got = _gemv(K.K_IQ1_M_T7_AVX512, p, act, n)
    for code, m in ((K.K_IQ1_M_T7, p), (K.K_IQ1_M, w)):
        want = _gemv(code, m, act, n)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), np.abs(got - want).max()
    ref = A.roundtrip(x.astype(np.float64), QT.Q8_K) @ dequantize(w, QT.IQ1_M).astype(np.float64).T
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()
    for repack, _, _, code in FV.values():  # the float-lane kernels: close, repeatable
        fv = _gemv(code, repack(w), act, n)
        assert np.abs(fv - ref).max() <= 2e-6 * np.abs(ref).max()
        again = _gemv(code, repack(w), act, n)
        assert np.array_equal(fv.view(np.uint32), again.view(np.uint32))


@needs_avx512
@pytest.mark.parametrize("cols", [256, 768, 2048])
def test_kernel_matches_portable_kernels_and_dequant(cols):
    rng = np.random.default_rng()
    _check(random_quantized(QT.IQ1_M, (7, cols), rng, 0.05), _activations(rng, 5, cols))


@needs_avx512
def test_kernel_every_grid_index_delta_scale_and_extreme():
    rng = np.random.default_rng()
    w = edge_iq1_m(rng, 4, 256 * 32)
    x = _activations(rng, 5, 256 * 32)
    x[0, :512] = np.where(rng.integers(0, 2, 512), 1.0, -1.0)  # +-127 quants
    x[1, :512] = 1.0
    _check(w, x)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="not x86-64")
def test_kernel_compiles_to_byte_permutes_and_vnni(tmp_path):
    """Compiled for Sapphire Rapids: a block is 4 vpdpbusd, 1 two-table byte permute, 1 vpermb,
    5 vpmultishiftqb, 2 vpackssdw, 1 vpermw; no gather, no trap."""
    asm, ops = avx512_asm(tmp_path, "iq1_t7_avx512", "dot_t7_avx512", BB)
    assert ops.count("vpdpbusd") == 4 and ops.count("vpmultishiftqb") == 5
    assert ops.count("vpermi2b") + ops.count("vpermt2b") == 1 and ops.count("vpermb") == 1
    assert ops.count("vpackssdw") == 2 and ops.count("vpermw") == 1
    assert "vpgatherdd" not in ops and "vpshufb" not in ops
    assert "pext" in asm
    asm, ops = avx512_asm(tmp_path, "iq1_t7_avx512", "dot_t7_avx512_fv", BB)
    assert ops.count("vpdpbusd") == 4 and ops.count("vpermb") == 1
    assert ops.count("vpermi2b") + ops.count("vpermt2b") == 1 and "vcvtdq2ps" in ops
    asm, ops = avx512_asm(tmp_path, "iq1_t2_avx512", "dot_t2_avx512_fv", iq1_t2.BB)
    assert ops.count("vpdpbusd") == 4 and "vcvtdq2ps" in ops and "vpermi2b" not in ops


# ---------------------------------------------------------------- the layout's place


def test_prepare_names_t7_and_t2(monkeypatch):
    shape = (2, 4, 512)
    w = random_quantized(QT.IQ1_M, shape, np.random.default_rng(), 0.05)
    monkeypatch.delenv("STRATA_CPU_SIMD", raising=False)
    m = L.prepare(QT.IQ1_M, shape, w, layout="IQ1_M=t7", simd=True)
    want = K.K_IQ1_M_T7_AVX512 if avx512_enabled(True) else K.K_IQ1_M_T7
    assert (m.layout, m.kernel) == ("t7", want)
    assert m.nbytes * 56 == m.gguf_bytes * BB
    assert np.array_equal(m.gguf_rows(), w.reshape(8, -1))
    m = L.prepare(QT.IQ1_M, shape, w, layout="t7", simd=False)
    assert (m.layout, m.kernel) == ("t7", K.K_IQ1_M_T7)
    assert L.prepare(QT.IQ1_M, shape, w, layout="t2", simd=False).kernel == K.K_IQ1_M_T2
    with pytest.raises(ValueError, match="no 't7' layout"):
        L.layout_for("Q4_K=t7", QT.Q4_K)


def test_dispatch_maps_the_codes_to_the_kernels():
    assert K.KERNELS[K.K_IQ1_M_T7] is iq1_t7.dot_t7_portable
    assert K.KERNELS[K.K_IQ1_M_T7_AVX512] is V.dot_t7_avx512
    assert K.KERNELS[K.K_IQ1_M_T7_AVX512_FV] is V.dot_t7_avx512_fv
    assert K.KERNELS[K.K_IQ1_M_T2_AVX512_FV] is T2V.dot_t2_avx512_fv
