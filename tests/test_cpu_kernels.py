"""CPU kernels: activation quantizers bit-exact with the NumPy oracle, quantized dots against
gguf's dequantization, SIMD kernels against the portable ones, repacks lossless, the kernel
table per host class."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from gguf.quants import dequantize
from numba import literally, njit

from strata.cpu import layout as L
from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels import lut4, reference
from strata.cpu.kernels.features import HAS_AVX2, avx512_enabled, simd_enabled
from strata.cpu.kernels.iq1 import portable as iq1
from strata.cpu.kernels.iq1 import t2_avx2 as iq1_t2
from strata.cpu.kernels.iq2 import portable as iq2
from strata.cpu.kernels.iq2 import s_lut4_avx2 as iq2s_lut4
from strata.cpu.kernels.iq3 import portable as iq3
from strata.cpu.kernels.iq4 import portable as iq4
from strata.cpu.kernels.kquants import portable as kquants
from strata.cpu.kernels.mxfp4 import portable as mxfp4
from strata.cpu.kernels.q8_0 import portable as q8_0
from strata.cpu.kernels.tile import TILE
from strata.cpu.layout import prepare
from strata.cpu.quantize import (
    act_code,
    act_unit,
    alloc_act,
    quantize_act,
    quantize_q8_0,
    quantize_q8_K,
    quantize_units,
    roundtrip,
)
from strata.quant import activation as A
from strata.quant import fmt, random_quantized
from strata.quant.formats import QT

TERMS = {
    QT.Q8_0: q8_0.terms,
    QT.Q4_K: kquants.q4_k_terms,
    QT.Q5_K: kquants.q5_k_terms,
    QT.Q6_K: kquants.q6_k_terms,
    QT.IQ4_XS: iq4.terms,
    QT.IQ3_XXS: iq3.iq3_xxs_terms,
    QT.IQ3_S: iq3.iq3_s_terms,
    QT.IQ2_XXS: iq2.iq2_xxs_terms,
    QT.IQ2_S: iq2.iq2_s_terms,
    QT.IQ1_M: iq1.terms,
    QT.MXFP4: mxfp4.terms,
}
FLOATS = (QT.F16, QT.BF16, QT.F32)
needs_avx2 = pytest.mark.skipif(not HAS_AVX2, reason="host has no AVX2")


def _activations(rng, n, d):
    """Rows that hit the quantizers' edge cases: zero blocks, outliers, ties, tiny values."""
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[0, :256] = 0  # an all-zero Q8_K block
    x[1, 3] = 1e3  # one outlier
    x[2] = np.round(x[2] * 8) / 8  # values on coarse grid: many exact .5 ties
    x[3, 7] = -x[3].max() * 2  # negative element of largest magnitude
    x[3, 9] = -x[3, 7]  # ... and a positive one of the same size after it
    x[4] *= 1e-30
    return x


def _gemv(code, w, act, n):
    y = np.zeros((n, w.shape[0]), np.float32)
    K.gemv(code, w, *act, y)
    return y


# ---------------------------------------------------------------- activation quantization


def test_q8_K_is_bit_identical_to_the_numpy_oracle():
    x = _activations(np.random.default_rng(), 6, 1024)
    d, q = quantize_q8_K(x)
    d0, q0 = A.quantize_q8_K(x)
    assert np.array_equal(q, q0)
    assert np.array_equal(d.view(np.uint32), d0.view(np.uint32))


def test_q8_0_is_bit_identical_to_the_numpy_oracle():
    x = _activations(np.random.default_rng(), 6, 1024)
    d, q = quantize_q8_0(x)
    d0, q0 = A.quantize_q8_0(x)
    assert np.array_equal(q, q0)
    assert np.array_equal(d.view(np.uint16), d0.view(np.uint16))


def test_q8_K_block_sums_are_sums_of_the_quants():
    x = _activations(np.random.default_rng(), 5, 512)
    xq, _, xb, x8, _ = quantize_act(x, QT.Q8_K)
    q = xq.astype(np.int64)
    assert np.array_equal(xb, q.reshape(5, -1, 16).sum(-1))
    assert np.array_equal(x8, q.reshape(5, -1, 8).sum(-1))


@pytest.mark.parametrize("vd", [QT.Q8_K, QT.Q8_0, QT.F16, QT.BF16, QT.F32], ids=lambda q: q.name)
def test_a_row_quantized_in_pieces_equals_the_whole_row(vd):
    """The pool splits one row's quantization over threads by units (blocks)."""
    x = _activations(np.random.default_rng(), 5, 768)
    want = quantize_act(x, vd)
    code = act_code(vd)
    got = alloc_act(*x.shape)
    n_units = x.shape[1] // act_unit(code)
    for r in range(x.shape[0]):
        cuts = sorted({0, n_units, *np.random.default_rng(r).integers(0, n_units, 2).tolist()})
        for u0, u1 in zip(cuts[:-1], cuts[1:], strict=True):
            quantize_units(x[r], code, r, *got, u0, u1)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("vd", [QT.Q8_K, QT.Q8_0, QT.F16, QT.F32], ids=lambda q: q.name)
def test_compiled_roundtrip_gives_the_numpy_bits(vd):
    """The host tier's activation round trip, compiled: the NumPy oracle's bits (float32 in,
    rows of several shapes, an all-zero block; float64 in goes to the oracle itself)."""
    g = np.random.default_rng()
    for shape in ((5, 256), (6, 512), (3, 2, 768)):  # (_activations: 5 rows or more)
        x = _activations(g, int(np.prod(shape[:-1])), shape[-1]).reshape(shape)
        x.reshape(-1, shape[-1])[0, :256] = 0.0
        got, want = roundtrip(x, vd), A.roundtrip(x, vd)
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    x64 = g.standard_normal((2, 256))
    assert np.array_equal(roundtrip(x64, vd), A.roundtrip(x64, vd))


@pytest.mark.parametrize("vd", [QT.F16, QT.BF16, QT.F32], ids=lambda q: q.name)
def test_float_activations_round_as_ggml(vd):
    x = _activations(np.random.default_rng(), 5, 512)
    x[0, 0] = 7e4  # beyond f16 range: inf, as F16C
    xf = quantize_act(x, vd)[4]
    with np.errstate(over="ignore"):
        assert np.array_equal(xf, A.roundtrip(x, vd))


# ---------------------------------------------------------------- portable kernels


@pytest.mark.parametrize("qtype", list(TERMS), ids=lambda q: q.name)
def test_reference_terms_are_the_dequantized_weights(qtype):
    w = random_quantized(qtype, (4, 512), np.random.default_rng(), 0.05)
    want = dequantize(w, qtype).astype(np.float64)
    got = reference.dequant_terms(TERMS[qtype](w))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("qtype", list(TERMS) + list(FLOATS), ids=lambda q: q.name)
def test_portable_kernel_matches_dequant_matmul(qtype):
    rng = np.random.default_rng()
    r, d, n = 6, 512, 3
    w = random_quantized(qtype, (r, d), rng, 0.05)
    x = _activations(rng, 5, d)[1:4]
    vd = fmt(qtype).vec_dot
    act = quantize_act(x, vd)
    y = _gemv(L.KERNEL_TABLE["portable"][qtype][1], w, act, n)
    # the float64 matmul on the activation as ggml rounds it: the integer dot is exact
    want = A.roundtrip(x.astype(np.float64), vd) @ dequantize(w, qtype).astype(np.float64).T
    scale = np.abs(want).max()
    assert np.abs(y - want).max() <= 2e-6 * scale
    if qtype in TERMS:  # and the NumPy reference of the integer dot agrees too
        ref = reference.ref_gemv(TERMS[qtype](w), act[0], act[1])
        assert np.abs(ref - want).max() <= 1e-12 * scale
        assert np.abs(y - ref).max() <= 2e-6 * scale


# ---------------------------------------------------------------- repacks and SIMD kernels

REPACKS = [  # (format, repack module, the AVX2 kernel that reads the repack)
    pytest.param(QT.IQ3_XXS, lut4, K.K_IQ3_XXS_LUT4_AVX2, id="IQ3_XXS"),
    pytest.param(QT.IQ1_M, iq1_t2, K.K_IQ1_M_T2_AVX2, id="IQ1_M"),
    pytest.param(
        QT.IQ3_S,
        SimpleNamespace(
            repack=lut4.repack_s,
            unpack=lut4.unpack_s,
            repack_reference=lut4.repack_s_reference,
            BB=lut4.BB,
        ),
        K.K_IQ3_S_LUT4_AVX2,
        id="IQ3_S",
    ),
    pytest.param(
        QT.IQ2_XXS,
        SimpleNamespace(
            repack=lut4.repack_2xxs,
            unpack=lut4.unpack_2xxs,
            repack_reference=lut4.repack_2xxs_reference,
            BB=lut4.BB,
        ),
        K.K_IQ2_XXS_LUT4_AVX2,
        id="IQ2_XXS",
    ),
    pytest.param(QT.IQ2_S, iq2s_lut4, K.K_IQ2_S_LUT4_AVX2, id="IQ2_S"),
]
AVX2_GGUF = [q for q, (lay, _) in L.KERNEL_TABLE["avx2"].items() if lay == "gguf"]


@pytest.mark.parametrize("qtype,mod,_s", REPACKS)
def test_repack_is_lossless(qtype, mod, _s):
    w = random_quantized(qtype, (7, 1024), np.random.default_rng(), 0.05)
    p = mod.repack(w)
    assert p.shape == (7, 1024 // 256 * mod.BB)
    assert np.array_equal(mod.unpack(p), w)
    if hasattr(mod, "repack_reference"):  # the Numba repack against its NumPy statement
        assert np.array_equal(p, mod.repack_reference(w))


def test_iq3_xxs_repack_covers_every_grid_entry_and_sign_field():
    rng = np.random.default_rng()
    w = random_quantized(QT.IQ3_XXS, (4, 256 * 8), rng, 0.05)
    bl = w.reshape(-1, 98)
    bl[:, 2:66] = np.arange(256, dtype=np.uint8).reshape(4, 64)[np.arange(bl.shape[0]) % 4]
    assert np.array_equal(lut4.unpack(lut4.repack(w)), w)


@needs_avx2
@pytest.mark.parametrize("qtype,mod,simd", REPACKS)
def test_avx2_kernel_on_the_repack_is_the_portable_kernel_bit_for_bit(qtype, mod, simd):
    rng = np.random.default_rng()
    w = random_quantized(qtype, (9, 1024), rng, 0.05)
    act = quantize_act(_activations(rng, 5, 1024), QT.Q8_K)
    want = _gemv(L.KERNEL_TABLE["portable"][qtype][1], w, act, 5)
    assert np.array_equal(_gemv(simd, mod.repack(w), act, 5), want)  # same sums, same steps


@needs_avx2
@pytest.mark.parametrize("qtype", AVX2_GGUF, ids=lambda q: q.name)
def test_avx2_kernel_on_gguf_bytes_matches_the_portable_kernel(qtype):
    rng = np.random.default_rng()
    w = random_quantized(qtype, (9, 1024), rng, 0.05)
    if qtype in (QT.Q4_K, QT.Q5_K):
        w.reshape(-1, fmt(qtype).block_bytes)[:3, 4:16] = 0xFF  # 6-bit scales and mins at max
    act = quantize_act(_activations(rng, 5, 1024), fmt(qtype).vec_dot)
    got = _gemv(L.KERNEL_TABLE["avx2"][qtype][1], w, act, 5)
    want = _gemv(L.KERNEL_TABLE["portable"][qtype][1], w, act, 5)
    assert np.array_equal(got, want)  # same integer sums, same float steps


@needs_avx2
def test_lut4_extreme_activations_do_not_saturate():
    """vpmaddubsw saturates int16 pairs: the LUT keeps u8 <= 126 so +-127 activations are exact."""
    rng = np.random.default_rng()
    w = random_quantized(QT.IQ3_XXS, (4, 512), rng, 0.05)
    bl = w.reshape(-1, 98)
    bl[:, 2:66] = 255  # grid entry 255: the largest magnitudes
    act = quantize_act(
        np.full((2, 512), 1.0, np.float32) * np.array([[1], [-1]], np.float32), QT.Q8_K
    )
    p = lut4.repack(w)
    assert np.array_equal(_gemv(K.K_IQ3_XXS_LUT4_AVX2, p, act, 2), _gemv(K.K_IQ3_XXS, w, act, 2))


@needs_avx2
@pytest.mark.parametrize("qtype", [QT.IQ2_S, QT.IQ2_XXS], ids=lambda q: q.name)
def test_iq2_avx2_kernels_are_exact_at_the_extremes(qtype):
    """Largest grid rows, every sign set (IQ2_S bit 7 is the -128 byte of the mask) and +-127
    activations: vpmaddubsw must not saturate and the signs must land on the right weights."""
    rng = np.random.default_rng()
    w = random_quantized(qtype, (6, 512), rng, 0.05)
    bl = w.reshape(-1, fmt(qtype).block_bytes)
    if qtype == QT.IQ2_S:
        bl[0::2, 34:66] = 0xFF  # all signs negative
        bl[1::2, 34:66] = 0x80  # only the 8th weight of each group
        bl[:, 66:74] = 0xFF  # high index bits: the last grid rows
    else:
        bl[:, 2:66] = 0xFF  # grid index 255 and sign field 127 in every word
    x = np.ones((3, 512), np.float32) * np.array([[1], [-1], [0.5]], np.float32)
    x[2, ::3] = -1.0
    act = quantize_act(x, QT.Q8_K)
    want = _gemv(L.KERNEL_TABLE["portable"][qtype][1], w, act, 3)
    lay, code = L.KERNEL_TABLE["avx2"][qtype]  # the lut4 repack (largest LUT entry 107)
    assert np.array_equal(_gemv(code, L.REPACKS[(qtype, lay)][0](w), act, 3), want)
    xr = A.roundtrip(x.astype(np.float64), QT.Q8_K)  # the activation as Q8_K rounds it
    ref = xr @ dequantize(w, qtype).astype(np.float64).T
    assert np.abs(want - ref).max() <= 2e-6 * np.abs(ref).max()


@pytest.mark.parametrize("n_in", [1024, 32 * 11], ids=["whole-steps", "tail-blocks"])
def test_mxfp4_kernels_are_exact_at_the_extremes(n_in):
    """Codes of the largest values, a row of the smallest scales (GGML_E8M0_TO_FP32_HALF's two
    subnormals and the smallest normals), large ones, +-127 activations, rows of whole
    8-block steps and of a scalar tail: every host path gives the portable kernel's bits, and
    that the float64 dot of the dequantized weights (the subnormal row to its float32 rounding)."""
    rng = np.random.default_rng()
    w = random_quantized(QT.MXFP4, (6, n_in), rng, 0.05)
    bl = w.reshape(6, -1, 17)
    big = np.array([0x77, 0xFF, 0x7F, 0xF7], np.uint8)  # +-12 (doubled E2M1 6.0) in both nibbles
    bl[0::3, :, 1:] = rng.choice(big, bl[0::3, :, 1:].shape)
    bl[1, :, 0] = np.arange(bl.shape[1]) % 4  # e = 0, 1, 2, 3
    bl[2, ::2, 0] = 160  # large scales (2**32: the row's float32 dot stays finite)
    bl[2, 1::2, 0] = 150
    x = np.ones((3, n_in), np.float32) * np.array([[1], [-1], [0.5]], np.float32)
    x[2, ::3] = -1.0
    act = quantize_act(x, QT.Q8_0)
    want = _gemv(K.K_MXFP4, w, act, 3)
    if HAS_AVX2:
        assert np.array_equal(_gemv(L.KERNEL_TABLE["avx2"][QT.MXFP4][1], w, act, 3), want)
    wf = dequantize(w, QT.MXFP4).astype(np.float64)
    assert np.array_equal(reference.dequant_terms(mxfp4.terms(w)), wf)
    ref = reference.ref_gemv(mxfp4.terms(w), act[0], act[1])
    xr = A.roundtrip(x.astype(np.float64), QT.Q8_0)
    assert np.array_equal(ref, xr @ wf.T) or np.allclose(ref, xr @ wf.T, rtol=1e-12, atol=0)
    assert np.all(np.isfinite(want)) and np.all(want[:, 1] != 0)
    for r in range(6):  # float32 sums of products d_x * d_w: subnormal in row 1 (2**-128 / 127)
        tol = (1e-3 if r == 1 else 2e-6) * np.abs(ref[:, r]).max()
        assert np.abs(want[:, r] - ref[:, r]).max() <= tol, r


def test_iq2_s_repack_covers_every_grid_entry_and_refuses_foreign_codes():
    rng = np.random.default_rng()
    w = random_quantized(QT.IQ2_S, (4, 256 * 8), rng, 0.05)
    bl = w.reshape(-1, iq2.S_BB)  # 32 blocks x 32 groups: each of the 1024 grid rows once
    idx = rng.permutation(1024).reshape(32, 32)
    bl[:, 2:34] = idx & 255
    hi = (idx >> 8).reshape(32, 8, 4)
    bl[:, 66:74] = (hi << np.array([0, 2, 4, 6])).sum(axis=-1)
    p = iq2s_lut4.repack(w)
    assert np.array_equal(iq2s_lut4.unpack(p), w)
    bad = p.copy()
    bad[0, 0] = (bad[0, 0] & 0xF0) | 3  # level 3: none of IQ2_S's three magnitudes
    with pytest.raises(ValueError, match="level IQ2_S does not have"):
        iq2s_lut4.unpack(bad)


TILED = [  # (format, its layout's repack or None, the kernel with a tile variant)
    pytest.param(QT.IQ3_XXS, lut4.repack, K.K_IQ3_XXS_LUT4_AVX2, marks=needs_avx2, id="IQ3_XXS"),
    pytest.param(QT.IQ3_S, lut4.repack_s, K.K_IQ3_S_LUT4_AVX2, marks=needs_avx2, id="IQ3_S"),
    pytest.param(
        QT.IQ2_XXS, lut4.repack_2xxs, K.K_IQ2_XXS_LUT4_AVX2, marks=needs_avx2, id="IQ2_XXS"
    ),
    pytest.param(QT.Q6_K, None, K.K_Q6_K_AVX2, marks=needs_avx2, id="Q6_K"),
    pytest.param(QT.F32, None, K.K_F32, id="F32"),
    pytest.param(QT.Q4_K, None, K.K_Q4_K, id="Q4_K-untiled"),  # dotn's one-row fallback
]


@njit
def _tiled(code, w, xq, xd, xb, x8, xf, rows, n):
    """y [R, n]: every row of w against act rows rows[:n] by one `dotn` call each."""
    literally(code)
    y = np.zeros((w.shape[0], TILE), np.float32)
    for r in range(w.shape[0]):
        K.dotn(code, w, r, xq, xd, xb, x8, xf, rows, n, y[r])
    return y[:, :n]


@njit
def _one_by_one(code, w, xq, xd, xb, x8, xf, n):
    """y [R, n]: every row of w against act rows 0..n-1 by the one-row `dot`."""
    literally(code)
    y = np.zeros((w.shape[0], n), np.float32)
    for r in range(w.shape[0]):
        for a in range(n):
            y[r, a] = K.dot(code, w, r, xq, xd, xb, x8, xf, a)
    return y


def test_every_tiled_kernel_is_tested():
    assert {p.values[2] for p in TILED} >= set(K.KERNELS_N)


@pytest.mark.parametrize("qtype,prep,code", TILED)
def test_a_tile_gives_the_one_row_kernel_bits_for_every_row(qtype, prep, code):
    """dotn on act rows in any order (repeats, a tile of one, a full tile) = dot on each."""
    rng = np.random.default_rng()
    w = random_quantized(qtype, (5, 512), rng, 0.05)
    w = prep(w) if prep is not None else w
    x = _activations(rng, 40, 512)
    act = quantize_act(x, fmt(qtype).vec_dot)
    want = _one_by_one(code, w, *act, 40)  # [R, T]
    for n in (1, 3, 8, 9, TILE):
        rows = rng.integers(0, 40, TILE).astype(np.int64)
        got = _tiled(code, w, *act, rows, n)
        assert np.array_equal(got, want[:, rows[:n]]), n
    assert np.array_equal(_gemv(code, w, act, 40), want.T)  # K.gemv: tiles of rows in order


def test_kernel_table_covers_every_format_on_every_host_class():
    formats = set(L.KERNEL_TABLE["portable"])
    for cls, row in L.KERNEL_TABLE.items():
        assert set(row) == formats, cls
        for q, (lay, code) in row.items():
            assert code in K.KERNELS
            assert lay == "gguf" or (q, lay) in L.REPACKS
    assert all(lay == "gguf" for lay, _ in L.KERNEL_TABLE["portable"].values())
    used = {code for row in L.KERNEL_TABLE.values() for _, code in row.values()}
    assert used == set(K.KERNELS)  # winners only: every kernel is some host's choice


def test_prepare_takes_the_host_class_row():
    rng = np.random.default_rng()
    shape = (2, 8, 512)
    w = random_quantized(QT.IQ3_XXS, shape, rng, 0.05)
    off = prepare(QT.IQ3_XXS, shape, w, simd=False)
    assert (off.layout, off.kernel) == ("gguf", K.K_IQ3_XXS)
    assert off.nbytes == off.gguf_bytes == w.nbytes
    assert np.shares_memory(off.data, w)
    on = prepare(QT.IQ3_XXS, shape, w, simd=True)
    if avx512_enabled(True):  # hosts with AVX-512 VBMI + VNNI: the position-major repack
        assert (on.layout, on.kernel) == ("pm", K.K_IQ3_XXS_PM_AVX512)
        assert on.gguf_bytes == w.nbytes and on.nbytes == w.nbytes // 98 * 102
    else:
        assert (on.layout, on.kernel) == ("lut4", K.K_IQ3_XXS_LUT4_AVX2)
        assert on.gguf_bytes == w.nbytes and on.nbytes == w.nbytes // 98 * 134
    assert np.array_equal(on.gguf_rows(), w.reshape(16, -1))
    w2 = random_quantized(QT.IQ2_S, shape, rng, 0.05)
    m = prepare(QT.IQ2_S, shape, w2, simd=True)  # lut4 on every SIMD host
    assert (m.layout, m.kernel) == ("lut4", K.K_IQ2_S_LUT4_AVX2)
    assert m.nbytes == w2.nbytes // 82 * 138 and np.array_equal(m.gguf_rows(), w2.reshape(16, -1))
    assert act_code(fmt(QT.Q4_K).vec_dot) == act_code(QT.Q8_K)


_FORCED = """
import numpy as np
from strata.cpu import force_level, prepare
from strata.quant import random_quantized
from strata.quant.formats import QT
force_level({level!r})
w = random_quantized(QT.Q4_K, (1, 4, 256), np.random.default_rng(0), 0.1)
print(prepare(QT.Q4_K, (1, 4, 256), w).kernel)
"""


@pytest.mark.parametrize("level", ["portable", "avx2"])
def test_force_level_picks_that_row(level):
    out = subprocess.run(
        [sys.executable, "-c", _FORCED.format(level=level)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cls = {"portable": "portable", "avx2": "avx2" if simd_enabled() else "portable"}[level]
    assert int(out) == L.KERNEL_TABLE[cls][QT.Q4_K][1]
