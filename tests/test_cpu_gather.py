"""The AVX2 gather kernels on the GGUF bytes (IQ3_XXS, IQ2_XXS, IQ1_M): bit-identical to the
portable kernels, true to gguf's dequantization, exact at the extremes; and the layout choice."""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import dequantize

from strata.cpu import layout as L
from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels import iq1, iq2, iq3, reference
from strata.cpu.kernels.simd import HAS_AVX2
from strata.cpu.layout import layout_for, prepare
from strata.cpu.quantize import quantize_act
from strata.quant import activation as A
from strata.quant import fmt, random_quantized
from strata.quant.formats import QT
from tests.test_cpu_kernels import _activations, _gemv

needs_avx2 = pytest.mark.skipif(not HAS_AVX2, reason="host has no AVX2")
GATHER = {
    QT.IQ3_XXS: (K.K_IQ3_XXS_GATHER, iq3.iq3_xxs_terms),
    QT.IQ2_XXS: (K.K_IQ2_XXS_GATHER, iq2.iq2_xxs_terms),
    QT.IQ1_M: (K.K_IQ1_M_GATHER, iq1.terms),
}
ids = lambda q: q.name  # noqa: E731


def _check(qtype, w, x):
    """Gather kernel == portable kernel (bits), and both against the float64 references."""
    code, terms = GATHER[qtype]
    act = quantize_act(x, QT.Q8_K)
    got = _gemv(code, w, act, x.shape[0])
    want = _gemv(K.PORTABLE[qtype], w, act, x.shape[0])
    assert np.array_equal(got, want), np.abs(got - want).max()
    ref = A.roundtrip(x.astype(np.float64), QT.Q8_K) @ dequantize(w, qtype).astype(np.float64).T
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= 2e-6 * scale
    assert np.abs(reference.ref_gemv(terms(w), act[0], act[1]) - ref).max() <= 1e-12 * scale


@needs_avx2
@pytest.mark.parametrize("cols", [256, 768, 2048])
@pytest.mark.parametrize("qtype", list(GATHER), ids=ids)
def test_gather_kernel_matches_portable_kernel_and_dequant(qtype, cols):
    rng = np.random.default_rng()
    w = random_quantized(qtype, (7, cols), rng, 0.05)
    _check(qtype, w, _activations(rng, 5, cols))


@needs_avx2
@pytest.mark.parametrize("qtype", [QT.IQ3_XXS, QT.IQ2_XXS], ids=ids)
def test_every_sign_field_and_grid_row_decodes(qtype):
    """All 128 ksigns fields (the 8th sign is their parity, computed in SIMD) in every field
    position, and all 256 grid rows."""
    rng = np.random.default_rng()
    nblk = 16
    w = random_quantized(qtype, (4, 256 * nblk), rng, 0.05)
    bl = w.reshape(-1, fmt(qtype).block_bytes)  # [64 blocks, bytes]
    n = bl.shape[0]
    field = (np.arange(n * 32) * 5 % 128).reshape(n, 8, 4).astype(np.uint32)  # [blk, s, g]
    ls = rng.integers(0, 16, (n, 8)).astype(np.uint32)
    aux = (field << (7 * np.arange(4, dtype=np.uint32))).sum(-1, dtype=np.uint32) | (ls << 28)
    if qtype == QT.IQ3_XXS:
        bl[:, 2:66] = (np.arange(n * 64) % 256).reshape(n, 64)
        bl[:, 66:98] = aux.astype("<u4").view(np.uint8).reshape(n, 32)
    else:
        words = bl[:, 2:66].copy().view("<u4").reshape(n, 8, 2)
        words[..., 0] = (np.arange(n * 32) % 256).astype(np.uint8).view("<u4").reshape(n, 8)
        words[..., 1] = aux
        bl[:, 2:66] = words.view(np.uint8).reshape(n, 64)
    _check(qtype, w, _activations(rng, 5, 256 * nblk))


@needs_avx2
def test_iq1_m_every_grid_index_delta_and_scale_decodes():
    """All 2048 grid rows (11-bit indices across qs and qh), both delta signs, all 3-bit scales."""
    rng = np.random.default_rng()
    w = random_quantized(QT.IQ1_M, (4, 256 * 32), rng, 0.05)
    bl = w.reshape(-1, 56)  # [128 blocks, 56]
    n = bl.shape[0]
    idx = (np.arange(n * 32) * 7 % 2048).reshape(n, 32)  # odd stride: every index, scattered
    nib = (idx >> 8) | (rng.integers(0, 2, (n, 32)) << 3)  # delta bit random
    bl[:, 0:32] = idx & 255
    bl[:, 32:48] = nib[:, 0::2] | (nib[:, 1::2] << 4)
    words = bl[:, 48:56].copy().view("<u2")  # [n, 4]: keep the f16 d nibbles on top
    ls = (np.arange(n * 16) % 8).reshape(n, 4, 4).astype(np.uint16)
    words[:] = (words & 0xF000) | (ls << (3 * np.arange(4, dtype=np.uint16))).sum(-1, np.uint16)
    bl[:, 48:56] = words.view(np.uint8)
    _check(QT.IQ1_M, w, _activations(rng, 5, 256 * 32))


@needs_avx2
@pytest.mark.parametrize("qtype", list(GATHER), ids=ids)
def test_gather_kernels_do_not_saturate_at_the_extremes(qtype):
    """Largest grid values, the largest scales, every sign negative or none, +-127 activations:
    vpmaddubsw's int16 pairs must stay exact."""
    rng = np.random.default_rng()
    w = random_quantized(qtype, (6, 512), rng, 0.05)
    bl = w.reshape(-1, fmt(qtype).block_bytes)
    if qtype == QT.IQ3_XXS:
        bl[:, 2:66] = 255  # grid row 255: the largest magnitudes
        bl[0::2, 66:98] = 0xFF  # every sign field 127, scale 15
        bl[1::2, 66:98] = np.array([0, 0, 0, 0xF0], np.uint8)[np.arange(32) % 4]  # no signs
    elif qtype == QT.IQ2_XXS:
        bl[0::2, 2:66] = 0xFF  # grid row 255, sign fields 127, scale 15
        bl[1::2, 2:66] = np.array([0xFF] * 4 + [0, 0, 0, 0xF0], np.uint8)[np.arange(64) % 8]
    else:
        bl[:, 48:56] |= np.array([0xFF, 0x0F] * 4, np.uint8)  # all scales 7, d kept
    x = np.ones((3, 512), np.float32) * np.array([[1], [-1], [0.5]], np.float32)
    x[2, ::3] = -1.0
    _check(qtype, w, x)


# ---------------------------------------------------------------- the layout choice


def test_layout_spec_picks_per_format(monkeypatch):
    assert layout_for("gguf", QT.IQ3_XXS) == "gguf"
    assert layout_for("repack", QT.IQ1_M) == "repack"
    spec = "auto,IQ3_XXS=gguf, iq1_m=gguf"
    assert [layout_for(spec, q) for q in (QT.IQ3_XXS, QT.IQ1_M, QT.IQ2_XXS)] == [
        "gguf",
        "gguf",
        "repack" if QT.IQ2_XXS not in L.AUTO_GGUF else "gguf",
    ]
    assert layout_for("gguf,IQ2_XXS=repack", QT.IQ2_XXS) == "repack"
    monkeypatch.setattr(L, "AUTO_GGUF", frozenset({QT.IQ2_XXS}))
    assert layout_for("auto", QT.IQ2_XXS) == "gguf"
    assert layout_for("auto", QT.IQ3_XXS) == "repack"
    for bad in ("fat", "IQ3_XXS=lut", "NOPE=gguf"):
        with pytest.raises(ValueError, match="unknown"):
            layout_for(bad, QT.IQ3_XXS)


@pytest.mark.parametrize("qtype", list(GATHER), ids=ids)
def test_prepare_gives_the_gather_kernel_on_the_file_bytes(qtype, monkeypatch):
    rng = np.random.default_rng()
    shape = (2, 4, 512)
    w = random_quantized(qtype, shape, rng, 0.05)
    gguf = L.gguf_kernel(qtype)  # the gather kernel, or the AVX-512 one where the host has it
    assert gguf in (GATHER[qtype][0], K.AVX512_GGUF.get(qtype))
    kept = prepare(qtype, shape, w, layout=f"repack,{qtype.name}=gguf", simd=True)
    assert (kept.layout, kept.kernel) == ("gguf", gguf)
    assert kept.nbytes == kept.gguf_bytes and np.shares_memory(kept.data, w)
    assert prepare(qtype, shape, w, layout="repack", simd=True).layout in ("lut4", "t2", "pm")
    assert prepare(qtype, shape, w, layout="gguf", simd=False).kernel == K.PORTABLE[qtype]
    monkeypatch.setattr(L, "AUTO_GGUF", frozenset({qtype}))
    assert prepare(qtype, shape, w, simd=True).kernel == gguf
    monkeypatch.setattr(L, "AUTO_GGUF", frozenset())
    monkeypatch.setenv("STRATA_CPU_LAYOUT", f"auto,{qtype.name}=gguf")
    assert prepare(qtype, shape, w, simd=True).kernel == gguf
