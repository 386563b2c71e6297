"""The AVX-512 Q4_K, Q5_K and Q6_K kernels on the GGUF bytes (kquants/avx512.py).

Everywhere: its tables state the layout (the vector k4 unpacking equals ggml's scalar one on
every byte pattern, the pack and word tables pair each dot word with its sub-block's scale and
each bsum with its sub-block's min, Q5_K's fifth-bit and Q6_K's high-bit controls pick each
weight's qh bits, Q6_K's scale words their sub-block's scale), and
the dispatch maps both formats on AVX-512 hosts to them; compiled for an AVX-512 CPU they have
the instructions they are written for and no trap. Where the host has every feature they use:
each kernel against the AVX2 kernel and the portable one (bits) and gguf's dequantization, on
fresh random rows, the largest quants, scales and mins, and -128 / +127 activations.
"""

from __future__ import annotations

import platform

import numpy as np
import pytest
from gguf.quants import dequantize

from strata.cpu import layout as L
from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels.kquants import avx512 as V
from strata.cpu.quantize import quantize_act
from strata.quant import activation as A
from strata.quant import random_quantized
from strata.quant.formats import QT
from tests.cpu_avx512_emu import avx512_asm, needs_avx512, pmultishiftqb
from tests.test_cpu_kernels import _activations, _gemv

BB = {QT.Q4_K: 144, QT.Q5_K: 176, QT.Q6_K: 210}
QO = {QT.Q4_K: 16, QT.Q5_K: 48}  # where qs starts in a block
KIND = [pytest.param(q, id=q.name) for q in (QT.Q4_K, QT.Q5_K, QT.Q6_K)]


def _k4_scalar(q):
    """ggml's get_scale_min_k4 over the 12 bytes q: (8 scales, 8 mins)."""
    sc = [q[j] & 63 if j < 4 else (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4) for j in range(8)]
    mn = [q[j + 4] & 63 if j < 4 else (q[j + 4] >> 4) | ((q[j] >> 6) << 4) for j in range(8)]
    return sc, mn


def test_vector_k4_unpack_equals_ggml_on_random_bytes():
    """The dword steps of `k4_unpack` (NumPy) give S = 8 scales then 8 mins."""
    rng = np.random.default_rng()
    q = rng.integers(0, 256, (500, 12), dtype=np.uint8)
    q[0], q[1] = 0xFF, 0  # every bit set, none
    u = q.view("<u4")  # [n, 3]
    a = u[:, V.UT_A] >> V.UT_SHIFT
    c = u[:, V.UT_B] >> 2
    s = np.ascontiguousarray((a & V.UT_M1) | (c & V.UT_M2)).view(np.uint8)  # [n, 16]
    for row, got in zip(q, s, strict=True):
        sc, mn = _k4_scalar([int(v) for v in row])
        assert list(got) == sc + mn


def test_pack_and_word_tables_pair_dots_with_their_sub_block():
    """Dword k of chunk j's vpdpbusd sums weights 64 j + 4 k .. + 3; vpackssdw (per 128-bit
    lane: four dwords of the first source, four of the second) puts them where PACK_SUB says,
    SC_IDX reads that sub-block's scale byte, MIN_IDX gives bsum k its sub-block's min."""
    for h in range(2):
        for L_ in range(4):
            for t in range(8):
                j = 2 * h + t // 4  # the chunk the word comes from
                k = 4 * L_ + t % 4  # its dword
                sub = (64 * j + 4 * k) // 32
                assert V.PACK_SUB[h, 8 * L_ + t] == sub
                assert V.SC_IDX[h, 2 * (8 * L_ + t)] == sub  # S byte `sub`: scale sub
    assert [V.MIN_IDX[2 * k] - 8 for k in range(16)] == [k * 16 // 32 for k in range(16)]
    lo = np.arange(64)  # the broadcast chunk: the low half keeps bytes 0..31, the high shifts
    assert (V.NIB_SHIFT[lo[::2] // 2] == np.where(lo[::2] < 32, 0, 4)).all()


def test_qh_control_puts_each_weights_fifth_bit_at_bit_4():
    """Q5_K: bit s of qh[i] is bit 4 of weight 32 s + i; vpmultishiftqb (NumPy) of the
    broadcast qh by QH_CTRL[j] puts, in byte i of chunk j's code vector (weight 64 j + i), that
    weight's bit at bit 4."""
    rng = np.random.default_rng()
    qh = rng.integers(0, 256, (64, 32), dtype=np.uint8)
    bq = np.ascontiguousarray(np.concatenate([qh, qh], axis=1))  # the broadcast
    for j in range(4):
        got = (pmultishiftqb(V.QH_CTRL[j], bq) >> 4) & 1
        w = 64 * j + np.arange(64)  # the weight of each byte
        want = (qh[:, w % 32] >> (w // 32)[None, :]) & 1
        assert np.array_equal(got, want)


def test_q6_k_controls_give_each_weight_its_high_bits_and_scale():
    """Q6_K (ggml's layout): weight 128 h + 32 k + l has high bits (qh[32 h + l] >> 2 k) & 3 and
    scale sc[(128 h + 32 k + l) // 16]; vpmultishiftqb of the broadcast qh[32 h ..] by
    Q6_QH_CTRL[c] puts them at bits 4, 5 of byte i of chunk c (weight 128 h + 64 c + i), and
    word 8 L + t of pack h (lane L of chunk t // 4) takes scale Q6_SC_IDX[h, 8 L + t]."""
    rng = np.random.default_rng()
    qh = rng.integers(0, 256, (64, 32), dtype=np.uint8)
    bq = np.ascontiguousarray(np.concatenate([qh, qh], axis=1))
    for c in range(2):
        got = (pmultishiftqb(V.Q6_QH_CTRL[c], bq) >> 4) & 3
        k = (64 * c + np.arange(64)) // 32  # the 32-weight group within the half
        want = (qh[:, np.arange(64) % 32] >> (2 * k)[None, :]) & 3
        assert np.array_equal(got, want)
    for h in range(2):
        for L_ in range(4):
            for t in range(8):
                first = 128 * h + 64 * (t // 4) + 16 * L_  # lane L of chunk t // 4 (16 weights)
                assert V.Q6_SC_IDX[h, 8 * L_ + t] == first // 16


def test_avx512_hosts_map_the_k_quants_gguf_to_the_kernels():
    row = L.KERNEL_TABLE["avx512"]
    assert row[QT.Q4_K] == ("gguf", K.K_Q4_K_AVX512) and K.K_Q4_K_AVX512 == 53
    assert row[QT.Q5_K] == ("gguf", K.K_Q5_K_AVX512) and K.K_Q5_K_AVX512 == 54
    assert row[QT.Q6_K] == ("gguf", K.K_Q6_K_AVX512) and K.K_Q6_K_AVX512 == 55
    assert K.KERNELS[K.K_Q6_K_AVX512] is V.dot_q6_k_avx512
    assert K.KERNELS[K.K_Q4_K_AVX512] is V.dot_q4_k_avx512
    assert K.KERNELS[K.K_Q5_K_AVX512] is V.dot_q5_k_avx512
    avx2 = L.KERNEL_TABLE["avx2"]  # AVX2 hosts keep their kernels
    assert avx2[QT.Q4_K] == ("gguf", K.K_Q4_K_AVX2) and avx2[QT.Q5_K] == ("gguf", K.K_Q5_K_AVX2)


# ---------------------------------------------------------------- the kernel (hosts with it)


def _check(qt, w, x):
    act = quantize_act(x, QT.Q8_K)
    got = _gemv(L.KERNEL_TABLE["avx512"][qt][1], w, act, x.shape[0])
    avx2 = _gemv(L.KERNEL_TABLE["avx2"][qt][1], w, act, x.shape[0])
    assert np.array_equal(got.view(np.uint32), avx2.view(np.uint32)), np.abs(got - avx2).max()
    want = _gemv(L.KERNEL_TABLE["portable"][qt][1], w, act, x.shape[0])
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), np.abs(got - want).max()
    ref = A.roundtrip(x.astype(np.float64), QT.Q8_K) @ dequantize(w, qt).astype(np.float64).T
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()


@needs_avx512
@pytest.mark.parametrize("qt", KIND)
@pytest.mark.parametrize("cols", [256, 768, 2048])
def test_kernel_matches_avx2_portable_and_dequant(qt, cols):
    rng = np.random.default_rng()
    _check(qt, random_quantized(qt, (7, cols), rng, 0.05), _activations(rng, 5, cols))


@needs_avx512
@pytest.mark.parametrize("qt", KIND)
def test_kernel_at_the_largest_quants_scales_and_mins(qt):
    rng = np.random.default_rng()
    w = random_quantized(qt, (4, 256 * 12), rng, 0.05)
    bl = w.reshape(-1, BB[qt])  # [48 blocks, bytes]
    if qt == QT.Q6_K:
        bl[0::3, :192] = 0xFF  # every quant 63: a dword of 4 * 63 * 128 at -128 activations
        bl[0::2, 192:208] = np.array([127, -128] * 8, np.int8).view(np.uint8)  # scale extremes
    else:
        bl[0::3, QO[qt] :] = 0xFF  # every quant 15 (Q5_K: 31)
        bl[0::3, 16:48] = 0xFF  # (Q4_K: quants 15 too; Q5_K: every fifth bit)
        bl[0::2, 4:16] = 0xFF  # every scale and min 63
    bl[1::4, 4:16] = rng.integers(0, 256, (len(bl[1::4]), 12), dtype=np.uint8)
    x = _activations(rng, 5, 256 * 12)
    x[0] = np.where(rng.integers(0, 2, x.shape[1]), 1.0, -1.0)  # +-127 quants
    x[1, ::256] = 10.0  # one -128 quant a block (Q8_K maps the largest value to -128)
    x[1] = -np.abs(x[1])
    _check(qt, w, x)


@needs_avx512
@pytest.mark.parametrize("qt", KIND)
def test_prepare_gives_the_avx512_kernel_on_the_file_bytes(qt):
    shape = (2, 4, 512)
    w = random_quantized(qt, shape, np.random.default_rng(), 0.05)
    m = L.prepare(qt, shape, w, simd=True)
    assert (m.layout, m.kernel) == L.KERNEL_TABLE[L.host_class(True)][qt]
    assert np.shares_memory(m.data, w)


# ---------------------------------------------------------------- the code an AVX-512 CPU gets


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="not x86-64")
@pytest.mark.parametrize("qt", KIND)
def test_kernel_compiles_to_vnni_dots_and_packed_scales(qt, tmp_path):
    """Compiled for Sapphire Rapids (avx512_asm): four broadcast chunks a block, each a vpsrlvw,
    an and and a vpdpbusd (Q5_K: and a vpmultishiftqb of the broadcast qh); two vpackssdw, byte
    permutes for the scale words, vpmaddwd; no trap."""
    asm, ops = avx512_asm(tmp_path, "kquants.avx512", f"dot_{qt.name.lower()}_avx512", BB[qt])
    assert ops.count("vpdpbusd") == 4 and ops.count("vpackssdw") == 2
    assert ops.count("vpmaddwd") + ops.count("vpdpwssd") == 2
    if qt == QT.Q6_K:  # two ql loads and two qh broadcasts a block, a vpmultishiftqb a chunk
        assert ops.count("vbroadcasti64x4") == 2 and ops.count("vpmultishiftqb") == 4
        assert {"vpermw", "vpermt2w", "vpermi2w", "vpmovsxbw"} & set(ops)  # the scale words
    else:
        q5 = qt == QT.Q5_K
        assert ops.count("vbroadcasti64x4") == 4 + q5 and ops.count("vpsrlvw") == 4
        assert ops.count("vpmultishiftqb") == 4 * q5
        assert {"vpermb", "vpermt2b", "vpermi2b"} & set(ops)
