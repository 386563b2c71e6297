"""Block-format registry, random valid quantized tensors, and llama.cpp's activation round trips."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from strata.quant import (
    FORMATS,
    MODEL_TYPES,
    QK_K,
    UnsupportedType,
    fmt,
    quantize_q8_0,
    quantize_q8_K,
    random_quantized,
    roundtrip,
)
from strata.quant.formats import QT

FLOAT_TYPES = (QT.F32, QT.F16, QT.BF16)


# ---------------------------------------------------------------- registry


@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda q: q.name)
def test_block_dtype_matches_ggml_sizes(qtype):
    f = FORMATS[qtype]
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    assert (f.block_elems, f.block_bytes) == (elems, nbytes)
    assert f.block_dtype().itemsize == nbytes
    assert sum(np.dtype(dt).itemsize * n for _, dt, n in f.layout) == nbytes


@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda q: q.name)
def test_row_and_tensor_bytes(qtype):
    f = FORMATS[qtype]
    n = 4 * QK_K
    assert f.row_bytes(n) == n // f.block_elems * f.block_bytes
    assert f.tensor_bytes((3, 5, n)) == 15 * f.row_bytes(n)
    assert f.tensor_bytes((n,)) == f.row_bytes(n)
    if f.block_elems > 1:
        with pytest.raises(ValueError):
            f.row_bytes(n + 1)
        with pytest.raises(ValueError):
            f.tensor_bytes((2, f.block_elems // 2))


def test_fmt_lookup_by_name_id_and_enum():
    assert fmt("iq3_xxs").qtype == QT.IQ3_XXS
    assert fmt("IQ3_XXS") is fmt(QT.IQ3_XXS)
    assert fmt(23).qtype == QT(23) == QT.IQ4_XS
    assert fmt(QT.Q8_0).vec_dot == QT.Q8_0
    assert fmt(QT.Q4_K).vec_dot == QT.Q8_K


@pytest.mark.parametrize("bad", ["q4_0", QT.Q4_0, 2, "not_a_type", 9999])
def test_fmt_refuses_unsupported_types_in_one_line(bad):
    with pytest.raises(UnsupportedType) as e:
        fmt(bad)
    msg = str(e.value)
    assert "\n" not in msg and msg
    if bad in ("q4_0", QT.Q4_0, 2):
        assert "Q4_0" in msg


# ---------------------------------------------------------------- random_quantized


@pytest.mark.parametrize("qtype", MODEL_TYPES, ids=lambda q: q.name)
def test_random_quantized_dequantizes_to_requested_std(qtype):
    std = 0.02
    raw = random_quantized(qtype, (64, 512), np.random.default_rng(11), std)
    assert raw.dtype == np.uint8
    assert raw.shape == (64, fmt(qtype).row_bytes(512))
    x = dequantize(raw, qtype).astype(np.float64)
    assert x.shape == (64, 512)
    assert np.all(np.isfinite(x))
    assert abs(x.std() / std - 1) < 0.3
    assert abs(x.mean()) < 0.1 * std
    assert np.count_nonzero(x) > 0.5 * x.size


@pytest.mark.parametrize("qtype", MODEL_TYPES, ids=lambda q: q.name)
def test_random_quantized_is_deterministic_per_seed(qtype):
    shape = (2, 3, 512)
    a = random_quantized(qtype, shape, np.random.default_rng(5), 1.5)
    b = random_quantized(qtype, shape, np.random.default_rng(5), 1.5)
    c = random_quantized(qtype, shape, np.random.default_rng(6), 1.5)
    assert a.shape == (2, 3, fmt(qtype).row_bytes(512))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    x = dequantize(a, qtype)
    assert abs(x.std() / 1.5 - 1) < 0.3


@pytest.mark.parametrize(
    "qtype", [q for q in MODEL_TYPES if q not in FLOAT_TYPES], ids=lambda q: q.name
)
def test_random_quantized_varies_block_scales(qtype):
    # blocks must not share one scale, or a kernel applying the wrong block's scale would pass
    raw = random_quantized(qtype, (4, 1024), np.random.default_rng(2), 0.05)
    if qtype == QT.MXFP4:  # power-of-two scales: a few values, but neighbours mostly differ
        e = raw.reshape(-1, 17)[:, 0]
        assert len(np.unique(e)) >= 3 and np.mean(e[1:] != e[:-1]) > 0.4
        return
    x = dequantize(raw, qtype).reshape(-1, fmt(qtype).block_elems)
    per_block = np.abs(x).max(axis=1)
    assert len(np.unique(per_block)) > len(per_block) // 2


# ---------------------------------------------------------------- MXFP4

# OCP MX v1.0: E2M1 (sign, 2 exponent bits with bias 1, 1 mantissa bit) and E8M0 (2**(e - 127))
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_mxfp4_dequantizes_as_the_ocp_formats_say():
    """Every code under every E8M0 scale that keeps the block finite: 2**(e - 127) * E2M1(code),
    weights j and j + 16 in the low and high nibbles of byte j (gguf.quants is the codec the
    kernels follow)."""
    rng = np.random.default_rng(41)
    blocks = rng.integers(0, 256, size=(300, 17), dtype=np.uint8)
    # every scale byte whose blocks stay finite in float32 (2**124 * 6 < 2**128), subnormal too
    blocks[:, 0] = np.concatenate([np.arange(252), rng.integers(0, 252, 300 - 252)])
    got = dequantize(blocks, QT.MXFP4).astype(np.float64)
    for b, blk in enumerate(blocks):
        codes = [blk[1 + j] & 15 for j in range(16)] + [blk[1 + j] >> 4 for j in range(16)]
        scale = 2.0 ** (int(blk[0]) - 127)
        want = [scale * (-1 if c & 8 else 1) * E2M1[c & 7] for c in codes]
        assert np.array_equal(got[b], want), b


def test_mxfp4_is_registered_for_expert_tensors():
    f = fmt("mxfp4")
    assert (f.block_elems, f.block_bytes, f.vec_dot) == (32, 17, QT.Q8_0)
    assert f.can_hold_experts and QT.MXFP4 in MODEL_TYPES


def test_random_quantized_q8_0_never_holds_minus_128():
    raw = random_quantized(QT.Q8_0, (64, 1024), np.random.default_rng(3), 1.0)
    qs = raw.reshape(-1, 34)[:, 2:].view(np.int8)
    assert qs.min() == -127 and qs.max() == 127


def test_random_quantized_refuses_bad_shapes_and_std():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        random_quantized(QT.Q4_K, (4, 100), rng, 1.0)
    with pytest.raises(ValueError):
        random_quantized(QT.IQ3_XXS, (4, 256), rng, 0.0)
    with pytest.raises(UnsupportedType):
        random_quantized(QT.Q4_0, (4, 256), rng, 1.0)


# ---------------------------------------------------------------- activation: references
# Straight per-block transcriptions of the C code, written independently of strata's vectorized
# versions (Python's round() is half-to-even on the exact value of the float32 product, which is
# what ggml's nearest_int and _mm256_round_ps(_MM_ROUND_NEAREST) compute for |v| < 2**22).

F32 = np.float32


def ref_q8_K(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quantize_row_q8_K_ref, one row of float32."""
    ds, qs = [], []
    for b in x.reshape(-1, QK_K):
        amax, vmax = F32(0), F32(0)
        for v in b:
            if abs(v) > amax:
                amax, vmax = abs(v), v
        if not amax:
            ds.append(F32(0))
            qs.extend([0] * QK_K)
            continue
        iscale = F32(-127.0) / vmax
        qs.extend(min(127, round(float(iscale * v))) for v in b)
        ds.append(F32(1.0) / iscale)
    return np.array(ds, dtype=np.float32), np.array(qs, dtype=np.int8)


def ref_q8_0_x86(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml-cpu x86 quantize_row_q8_0 (AVX2 path), one row of float32."""
    ds, qs = [], []
    for b in x.reshape(-1, 32):
        amax = F32(max(abs(v) for v in b))
        ds.append(np.float16(amax / F32(127.0)))
        inv = F32(127.0) / amax if amax != 0 else F32(0)
        qs.extend(round(float(v * inv)) for v in b)
    return np.array(ds, dtype=np.float16), np.array(qs, dtype=np.int8)


def ref_q8_0_scalar(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0_ref (what gguf-py copies), one row: the raw block bytes."""
    out = []
    for b in x.reshape(-1, 32):
        amax = F32(max(abs(v) for v in b))
        d = amax / F32(127.0)
        inv = F32(1.0) / d if d else F32(0)
        q = [int(math.copysign(math.floor(abs(float(v * inv)) + 0.5), float(v))) for v in b]
        out.append(np.float16(d).tobytes() + np.array(q, dtype=np.int8).tobytes())
    return np.frombuffer(b"".join(out), dtype=np.uint8)


def activation_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows at several scales with outliers, a negative max, an all-zero block and exact ties."""
    rows = []
    for scale in (1e-3, 1.0, 300.0):
        r = rng.standard_normal((3, n)).astype(np.float32) * F32(scale)
        r[0, rng.integers(n)] = F32(50 * scale)  # one large positive outlier
        r[1, rng.integers(n)] = F32(-80 * scale)  # negative max
        r[2, QK_K : 2 * QK_K] = 0  # an all-zero block
        rows.append(r)
    ties = rng.integers(-126, 126, size=(2, n)).astype(np.float32) + F32(0.5)
    ties[0, ::QK_K] = -127.0  # |max| = 127 in every block: scales of exactly 1, x*scale on .5
    ties[1, 3::32] = 127.0  # +127 first, then -127: the first of equal magnitudes wins
    ties[1, 10::32] = -127.0
    rows.append(ties)
    return np.concatenate(rows)


def q8_0_scale_sensitive_rows(rng: np.random.Generator, n_rows: int, n: int) -> np.ndarray:
    """Q8_0 blocks whose quants change if 127/amax is replaced by 1/(amax/127) (scalar ref)."""
    blocks = []
    while len(blocks) < n_rows * n // 32:
        a = F32(rng.uniform(0.5, 2.0))
        id_x86, id_ref = F32(127) / a, F32(1) / (a / F32(127))
        if id_x86 == id_ref:
            continue
        k = np.arange(126, dtype=np.float64)[:, None]
        x0 = ((k + 0.5) / float(id_x86)).astype(np.float32)
        xs = (x0 + np.arange(-4, 5, dtype=np.float32) * np.spacing(x0)).astype(np.float32)
        hit = np.rint(xs * id_x86) != np.rint(xs * id_ref)
        vals = xs[hit]
        if len(vals) < 31:
            continue
        b = np.concatenate([[a], rng.choice(vals, 31, replace=False)]).astype(np.float32)
        b *= np.where(rng.random(32) < 0.5, F32(-1), F32(1))
        blocks.append(rng.permutation(b))
    return np.stack(blocks).reshape(n_rows, n)


# ---------------------------------------------------------------- activation: Q8_K


def test_quantize_q8_K_is_bit_exact_with_ggml_reference():
    rng = np.random.default_rng(101)
    x = activation_rows(rng, 4 * QK_K)
    d, qs = quantize_q8_K(x)
    assert d.dtype == np.float32 and qs.dtype == np.int8
    assert d.shape == (x.shape[0], 4) and qs.shape == x.shape
    for r in range(x.shape[0]):
        rd, rq = ref_q8_K(x[r])
        assert np.array_equal(d[r].view(np.uint32), rd.view(np.uint32)), r
        assert np.array_equal(qs[r], rq), r
    assert np.all(d[8, 1] == 0) and np.all(qs[8, QK_K : 2 * QK_K] == 0)  # zero block
    assert np.any(qs[-2] % 2 == 0) and np.all(d[-2] == 1.0)  # ties were exercised


def test_quantize_q8_K_maps_the_signed_max_to_minus_127():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 2 * QK_K)).astype(np.float32)
    x[:, 17] = -9.0
    x[:, QK_K + 40] = 9.0
    d, qs = quantize_q8_K(x)
    assert np.all(qs[:, 17] == -127) and np.all(qs[:, QK_K + 40] == -127)
    assert np.all(d[:, 0] > 0) and np.all(d[:, 1] < 0)


def test_quantize_q8_K_handles_leading_axes_and_float64():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 2 * QK_K))
    d, qs = quantize_q8_K(x)
    d32, qs32 = quantize_q8_K(x.astype(np.float32).reshape(6, -1))
    assert d.shape == (2, 3, 2) and qs.shape == x.shape
    assert np.array_equal(d.reshape(6, -1), d32) and np.array_equal(qs.reshape(6, -1), qs32)


# ---------------------------------------------------------------- activation: Q8_0


def test_quantize_q8_0_is_bit_exact_with_x86_path():
    rng = np.random.default_rng(202)
    x = np.concatenate(
        [activation_rows(rng, 2 * QK_K), q8_0_scale_sensitive_rows(rng, 4, 2 * QK_K)]
    )
    d, qs = quantize_q8_0(x)
    assert d.dtype == np.float16 and d.shape == (x.shape[0], 2 * QK_K // 32)
    for r in range(x.shape[0]):
        rd, rq = ref_q8_0_x86(x[r])
        assert np.array_equal(d[r].view(np.uint16), rd.view(np.uint16)), r
        assert np.array_equal(qs[r], rq), r


def test_gguf_q8_0_is_the_scalar_reference():
    # the oracle for the comparison below: gguf-py copies quantize_row_q8_0_ref exactly
    rng = np.random.default_rng(203)
    x = activation_rows(rng, 2 * QK_K)
    g = quantize(x, QT.Q8_0)
    for r in range(x.shape[0]):
        assert np.array_equal(g[r], ref_q8_0_scalar(x[r])), r


def test_quantize_q8_0_differs_from_gguf_only_on_ties():
    rng = np.random.default_rng(204)
    x = np.concatenate(
        [activation_rows(rng, 2 * QK_K), q8_0_scale_sensitive_rows(rng, 4, 2 * QK_K)]
    )
    d, qs = quantize_q8_0(x)
    g = quantize(x, QT.Q8_0).reshape(x.shape[0], -1, 34)
    assert np.array_equal(d.view(np.uint8).reshape(*d.shape, 2), g[..., :2])
    gq = np.ascontiguousarray(g[..., 2:]).view(np.int8).reshape(x.shape)
    diff = qs.astype(np.int16) - gq
    assert np.abs(diff).max() <= 1
    # where they differ, x*127/amax lies on a .5 tie (or within a couple of float32 ulps of one,
    # the scalar path scaling by 1/(amax/127) instead)
    amax = np.abs(x.reshape(x.shape[0], -1, 32)).max(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = (x.reshape(amax.shape[0], -1, 32) * (F32(127) / amax)).reshape(x.shape)
    where = diff != 0
    frac = np.abs(np.abs(y[where]) - np.floor(np.abs(y[where])) - 0.5)
    assert np.all(frac <= 4 * np.spacing(np.abs(y[where]).astype(np.float32)))
    assert np.count_nonzero(diff[-6:-4]) > 0  # exact ties do differ
    assert np.count_nonzero(diff[-4:]) > 0  # and so do near ties under the two scales


# ---------------------------------------------------------------- activation: round trips


def test_roundtrip_q8_K_is_d_times_qs():
    rng = np.random.default_rng(301)
    x = activation_rows(rng, 2 * QK_K)
    d, qs = quantize_q8_K(x)
    want = (d[:, :, None] * qs.reshape(x.shape[0], -1, QK_K).astype(np.float32)).reshape(x.shape)
    got = roundtrip(x, QT.Q8_K)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # each value moves by at most half a quantization step
    step = np.repeat(np.abs(d), QK_K, axis=1)
    assert np.all(np.abs(got - x) <= 0.501 * step)


def test_roundtrip_q8_0_is_f16_d_times_qs():
    rng = np.random.default_rng(302)
    x = activation_rows(rng, 2 * QK_K)
    d, qs = quantize_q8_0(x)
    d32 = d.astype(np.float32)[:, :, None]
    want = (d32 * qs.reshape(x.shape[0], -1, 32).astype(np.float32)).reshape(x.shape)
    got = roundtrip(x, QT.Q8_0)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("vec_dot", [QT.Q8_K, QT.Q8_0, QT.F16, QT.BF16])
def test_roundtrip_of_float64_is_the_float32_quantization_in_float64(vec_dot):
    rng = np.random.default_rng(303)
    x64 = rng.standard_normal((4, 2 * QK_K)) * 3.0
    got = roundtrip(x64, vec_dot)
    assert got.dtype == np.float64
    got32 = roundtrip(x64.astype(np.float32), vec_dot)
    assert np.array_equal(got.astype(np.float32), got32)
    if vec_dot == QT.Q8_K:  # the float64 product d*qs is exact
        d, qs = quantize_q8_K(x64)
        want = d.astype(np.float64)[:, :, None] * qs.reshape(4, -1, QK_K)
        assert np.array_equal(got, want.reshape(x64.shape))


def test_roundtrip_f16_and_bf16_round_to_nearest_even():
    rng = np.random.default_rng(304)
    x = (rng.standard_normal((8, 256)) * 10.0 ** rng.integers(-6, 4, (8, 1))).astype(np.float32)
    x[0, :4] = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-8, 1 + 3 * 2.0**-8]  # exact ties
    f16 = roundtrip(x, QT.F16)
    assert np.array_equal(f16, x.astype(np.float16).astype(np.float32))
    assert f16[0, 0] == 1.0 and f16[0, 1] == 1 + 2 * 2.0**-10
    bf16 = roundtrip(x, QT.BF16)
    want = dequantize(quantize(x, QT.BF16), QT.BF16)
    assert np.array_equal(bf16.view(np.uint32), want.view(np.uint32))
    assert bf16[0, 2] == 1.0 and bf16[0, 3] == 1 + 2 * 2.0**-7


def test_roundtrip_f32_is_identity():
    rng = np.random.default_rng(305)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    assert np.array_equal(roundtrip(x, QT.F32), x)
    x64 = rng.standard_normal((3, 64))
    assert np.array_equal(roundtrip(x64, QT.F32), x64)


def test_roundtrip_refuses_other_types_and_partial_blocks():
    x = np.random.default_rng(306).standard_normal((2, QK_K)).astype(np.float32)
    with pytest.raises(UnsupportedType):
        roundtrip(x, QT.Q4_K)
    with pytest.raises(ValueError):
        roundtrip(x[:, :100], QT.Q8_K)
    with pytest.raises(ValueError):
        roundtrip(x[:, :40], QT.Q8_0)
