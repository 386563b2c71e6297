"""The AVX-512 IQ2_S kernel on the GGUF bytes (iq2s_avx512.py).

Everywhere: its tables state the layout (every grid row in the level nibbles, the index and
scale shift controls pick the bits the block layout puts there), and the dispatch maps IQ2_S on
AVX-512 hosts to it; compiled for an AVX-512 CPU it has the instructions it is written for and
no trap. Where the host has every feature it uses: the kernel itself against the AVX2 kernel
and the portable one (bits) and gguf's dequantization, on fresh random rows, every grid row,
every scale, every sign and +-127 activations.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
from gguf.quants import dequantize

from strata.cpu import layout as L
from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels import iq2s_avx512 as V
from strata.cpu.kernels.tables import IQ2S_GRID
from strata.cpu.quantize import quantize_act
from strata.quant import activation as A
from strata.quant import random_quantized
from strata.quant.formats import QT
from tests.test_cpu_iq3_vbmi import avx512_asm, needs_avx512, pmultishiftqb
from tests.test_cpu_kernels import _activations, _gemv

BB = 82


def test_tables_state_the_layout():
    """GRID_NIB holds every grid row as level nibbles (magnitude MAG[level]); the lane order
    makes XL / XH in-lane vshufps of the natural activation vectors."""
    c = (V.GRID_NIB[:, None] >> (4 * np.array([0, 2, 4, 6, 1, 3, 5, 7]))) & 15
    assert c.max() <= 2  # bit 7 of every byte of G and G >> 4 is clear (vpshufb)
    assert np.array_equal(V.MAG[c], IQ2S_GRID)
    assert sorted(V.GROUPS) == list(range(16))
    for src in (V.X_LO, V.X_HI):  # per 128-bit lane k: (a0, a2, b0, b2) or (a1, a3, b1, b3)
        lane = np.array(src).reshape(4, 4) - 4 * np.arange(4)[:, None]
        assert (lane[:, :2] < 4).all() and ((lane[:, 2:] >= 16) & (lane[:, 2:] < 20)).all()


def test_index_and_scale_controls_pick_the_block_bits():
    """The vpermt2b + vpmultishiftqb + and steps (NumPy) give each gather lane its group's
    10-bit index, and the scale vpmultishiftqb + and / or its sub-block's 2 ls + 1."""
    rng = np.random.default_rng()
    bl = rng.integers(0, 256, (256, BB), dtype=np.uint8)
    ab = np.concatenate([bl[:, 2:34], bl[:, 42:74]], axis=1)  # the two 32-byte loads
    p = np.ascontiguousarray(ab[:, V.PSEL])
    qh = ((bl[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & 3).reshape(-1, 32)
    idx = bl[:, 2:34].astype(np.uint32) | (qh.astype(np.uint32) << 8)  # [n, 32 groups]
    sq = np.ascontiguousarray(np.tile(bl[:, 74:82], 8))  # vpbroadcastq
    ls = ((bl[:, 74:82, None] >> np.array([0, 4], np.uint8)) & 15).reshape(-1, 16)
    for h in range(2):
        got = np.ascontiguousarray(pmultishiftqb(V.IDX_CTRL[h], p)).view("<u4") & 0x3FF
        assert np.array_equal(got, idx[:, V.GROUPS + 16 * h])
        sc = (np.ascontiguousarray(pmultishiftqb(V.SC_CTRL[h], sq)).view("<u2") & 0x1E) | 1
        want = 2 * ls[:, (V.GROUPS + 16 * h) // 2].astype(np.uint16) + 1
        assert np.array_equal(sc, np.repeat(want, 2, axis=1))


def test_avx512_hosts_map_iq2_s_gguf_to_the_kernel():
    assert K.AVX512_GGUF[QT.IQ2_S] == K.K_IQ2_S_AVX512 == 45
    assert K.KERNELS[K.K_IQ2_S_AVX512] is V.dot_iq2_s_avx512
    assert K.SIMD_GGUF[QT.IQ2_S] == K.K_IQ2_S_AVX2  # AVX2 hosts keep code 34


# ---------------------------------------------------------------- the kernel (hosts with it)


def _check(w, x):
    act = quantize_act(x, QT.Q8_K)
    got = _gemv(K.K_IQ2_S_AVX512, w, act, x.shape[0])
    avx2 = _gemv(K.K_IQ2_S_AVX2, w, act, x.shape[0])
    assert np.array_equal(got.view(np.uint32), avx2.view(np.uint32)), np.abs(got - avx2).max()
    want = _gemv(K.K_IQ2_S, w, act, x.shape[0])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), np.abs(got - want).max()
    ref = A.roundtrip(x.astype(np.float64), QT.Q8_K) @ dequantize(w, QT.IQ2_S).astype(np.float64).T
    assert np.abs(got - ref).max() <= 2e-6 * np.abs(ref).max()


@needs_avx512
@pytest.mark.parametrize("cols", [256, 768, 2304])
def test_kernel_matches_avx2_portable_and_dequant(cols):
    rng = np.random.default_rng()
    _check(random_quantized(QT.IQ2_S, (7, cols), rng, 0.05), _activations(rng, 5, cols))


@needs_avx512
def test_kernel_every_grid_row_scale_sign_and_extreme():
    rng = np.random.default_rng()
    w = random_quantized(QT.IQ2_S, (4, 256 * 40), rng, 0.05)
    bl = w.reshape(-1, BB)  # [160 blocks, 82]
    idx = (np.arange(len(bl) * 32) * 7 % 1024).reshape(-1, 32)  # every 10-bit index, scattered
    bl[:, 2:34] = idx & 255
    hi = (idx >> 8).reshape(-1, 8, 4)
    bl[:, 66:74] = (hi << np.array([0, 2, 4, 6])).sum(-1)
    ls = (np.arange(len(bl) * 16) % 16).reshape(-1, 8, 2)  # every scale
    bl[:, 74:82] = ls[..., 0] | (ls[..., 1] << 4)
    bl[0::3, 34:66] = 0xFF  # all signs negative
    bl[1::3, 34:66] = 0x80  # only the 8th weight of each group (bit 7 of each mask byte)
    bl[:2, 66:74] = 0xFF  # the last grid rows
    bl[:2, 74:82] = 0xFF  # scale 31
    x = _activations(rng, 5, 256 * 40)
    x[0, :2048] = np.where(rng.integers(0, 2, 2048), 1.0, -1.0)  # +-127 quants
    x[1, :2048] = 1.0
    _check(w, x)


@needs_avx512
def test_prepare_gives_the_avx512_kernel_on_the_file_bytes(monkeypatch):
    shape = (2, 4, 512)
    w = random_quantized(QT.IQ2_S, shape, np.random.default_rng(), 0.05)
    kept = L.prepare(QT.IQ2_S, shape, w, layout="gguf", simd=True)
    assert (kept.layout, kept.kernel) == ("gguf", K.K_IQ2_S_AVX512)
    assert L.prepare(QT.IQ2_S, shape, w, layout="IQ2_S=gguf", simd=True).kernel == K.K_IQ2_S_AVX512
    monkeypatch.setenv("STRATA_CPU_SIMD", "avx2")
    assert L.prepare(QT.IQ2_S, shape, w, layout="gguf").kernel == K.K_IQ2_S_AVX2
    assert L.prepare(QT.IQ2_S, shape, w, layout="gguf", simd=False).kernel == K.K_IQ2_S


# ---------------------------------------------------------------- the code an AVX-512 CPU gets


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="not x86-64")
def test_kernel_compiles_to_avx512_gathers_and_vnni(tmp_path):
    """Compiled for Sapphire Rapids (avx512_asm): two zmm vpgatherdd a block, vpermt2b /
    vpmultishiftqb / vpshufb, masked byte subtracts from kmovq masks, vpmaddubsw + vpaddw +
    vpmaddwd, no trap."""
    asm, ops = avx512_asm(tmp_path, "iq2s_avx512", "dot_iq2_s_avx512", BB)
    assert ops.count("vpgatherdd") == 2
    assert ops.count("vpmultishiftqb") == 4 and ops.count("vpshufb") == 4
    assert ops.count("vpmaddubsw") == 4 and ops.count("vpsubb") == 4
    assert ops.count("vpaddw") == 2 and ops.count("vpmaddwd") == 2
    assert "kmovq" in asm and {"vpermt2b", "vpermi2b"} & set(ops)
