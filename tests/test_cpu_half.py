"""strata.cpu.half: F16C conversions give NumPy's float16 casts bit for bit; so does the
kernels' scalar conversion, without a false dependency on x86."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from strata.cpu.half import round_f16, to_f32
from strata.cpu.kernels import common, features
from strata.cpu.kernels.common import f16_bits_to_f32

SPECIAL = [0.0, -0.0, np.inf, -np.inf, 65504.0, 65519.99, 65520.0, -7e4, 6.1035156e-05,
           6.1e-05, 5.9604645e-08, 2.9802322e-08, 2.98e-08, 1e-9, 1.0009765625, 1.00048828125,
           1.00146484375, 2049.0, 2051.0]  # fmt: skip


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit patterns, any NaN matching any NaN."""
    na, nb = np.isnan(a), np.isnan(b)
    return bool((na == nb).all() and np.array_equal(a[~na].view(np.uint32), b[~nb].view(np.uint32)))


@pytest.mark.parametrize("simd", ["1", "0"])
@pytest.mark.parametrize("n", [1, 8, 13, 1003])
def test_round_f16_is_numpys_cast(monkeypatch, simd, n):
    """Round to nearest even at every scale: subnormal f16, ties, overflow to inf, NaN."""
    monkeypatch.setattr(features, "_cap", "portable" if simd == "0" else "avx512vbmi")
    g = np.random.default_rng()
    scale = g.choice([1e-9, 1e-6, 1e-4, 1.0, 300.0, 7e4], n)
    x = (g.standard_normal(n) * scale).astype(np.float32)
    x[: min(n, len(SPECIAL))] = SPECIAL[: min(n, len(SPECIAL))]
    if n > 30:
        x[25] = np.nan
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    got = round_f16(x.reshape(-1, 1) if n % 2 else x)  # any shape
    assert got.dtype == np.float32 and got.shape == (x.reshape(-1, 1) if n % 2 else x).shape
    assert same_bits(got.reshape(-1), want)


@pytest.mark.parametrize("simd", ["1", "0"])
@pytest.mark.parametrize("shape", [(3,), (16,), (7, 3, 5), (1000, 2, 8)])
def test_to_f32_is_numpys_cast(monkeypatch, simd, shape):
    """Every f16 bit pattern class (subnormals, inf, NaN) widened exactly, shape kept."""
    monkeypatch.setattr(features, "_cap", "portable" if simd == "0" else "avx512vbmi")
    bits = np.random.default_rng().integers(0, 1 << 16, int(np.prod(shape)), dtype=np.uint16)
    h = bits.view(np.float16).reshape(shape)
    got = to_f32(h)
    assert got.dtype == np.float32 and got.shape == shape
    assert same_bits(got.reshape(-1), h.astype(np.float32).reshape(-1))
    strided = h[..., ::2] if len(shape) > 1 else h[::2]  # a non-contiguous view
    assert same_bits(to_f32(strided).reshape(-1), strided.astype(np.float32).reshape(-1))


@njit(cache=False)
def _scalar_f16_all(bits, out):
    for i in range(bits.size):
        out[i] = f16_bits_to_f32(bits[i])


@njit(cache=False)
def _scalar_f16_sum(bits, scale):
    """A loop whose float accumulator the f16 conversions must not wait on."""
    acc = np.float32(0.0)
    for i in range(bits.size):
        acc += f16_bits_to_f32(bits[i]) * scale[i]
    return acc


def test_scalar_f16_conversion_is_exact_for_every_bit_pattern():
    """The kernels' scalar f16 -> f32 (`common.f16_bits_to_f32`: vmovd + vcvtph2ps on x86 F16C
    hosts) is NumPy's cast for all 65536 patterns (NaNs as NaNs)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    out = np.empty(bits.size, np.float32)
    _scalar_f16_all(bits, out)
    assert same_bits(out, bits.view(np.float16).astype(np.float32))


@pytest.mark.skipif(not common.X86_F16C, reason="x86 F16C hosts only")
def test_scalar_f16_conversion_has_no_false_dependency():
    """LLVM lowers a scalar `fpext half` to vpinsrw into a register whose other lanes it leaves
    (often the loop's float accumulator): each conversion then waits for the previous
    iteration's sums (K-quant kernels 5-14% slower on an AVX2 EPYC). The conversion goes
    through vmovd from a general register instead: no vpinsrw feeds a vcvtph2ps."""
    bits = np.arange(64, dtype=np.uint16)
    _scalar_f16_sum(bits, np.ones(64, np.float32))
    asm = "\n".join(_scalar_f16_sum.inspect_asm().values())
    assert "vcvtph2ps" in asm
    assert "vpinsrw" not in asm
