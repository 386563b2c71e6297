"""Dense matrices on the CPU pool's kernels (strata/cpu/dense.py) against the host tier's float
path (dequantized weights, the rounded activation): float noise apart, every format and float
type, bias, a leading batch shape; and a host tier built on them decodes like the float one."""

from __future__ import annotations

import gguf.quants
import numpy as np
import pytest

from strata.cpu.dense import QuantLinear, linears
from strata.quant import fmt, random_quantized
from strata.quant.activation import roundtrip
from strata.quant.formats import QT

FORMATS = [QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.IQ3_XXS, QT.IQ3_S, QT.IQ2_XXS]
FORMATS += [QT.IQ2_S, QT.IQ1_M, QT.MXFP4, QT.F16, QT.BF16, QT.F32]


class _T:
    def __init__(self, qt, shape, data):
        self.qtype, self.shape, self.data = qt, shape, data


@pytest.mark.parametrize("qt", FORMATS, ids=lambda q: q.name)
def test_quant_linear_matches_the_float_path(qt):
    g = np.random.default_rng()
    rows, cols = 37, 512
    raw = random_quantized(qt, (rows, cols), g, 1 / np.sqrt(cols))
    bias = g.standard_normal(rows).astype(np.float32)
    lin = QuantLinear(_T(qt, (rows, cols), raw), fmt(qt).vec_dot, bias=bias)
    w = gguf.quants.dequantize(raw.view(np.uint8).reshape(rows, -1), qt).reshape(rows, cols)
    for shape in ((1, cols), (5, cols), (2, 3, cols)):
        x = g.standard_normal(shape).astype(np.float32)
        want = roundtrip(x, fmt(qt).vec_dot) @ w.T + bias
        got = lin(x)
        assert got.shape == want.shape and got.dtype == np.float32
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("qt", [QT.Q6_K, QT.IQ3_XXS, QT.F32], ids=lambda q: q.name)
def test_linears_on_one_input_give_each_linears_bits(qt):
    """q, k, v on one x: quantized once, one job (tiles of 32 act rows and the rest), the bits
    of each matrix's own call; mixed types or a bias fall back to one call each."""
    g = np.random.default_rng()
    cols = 512
    lins = []
    for rows in (64, 16, 24):
        raw = random_quantized(qt, (rows, cols), g, 1 / np.sqrt(cols))
        lins.append(QuantLinear(_T(qt, (rows, cols), raw), fmt(qt).vec_dot))
    for t in (1, 37, 70):
        x = g.standard_normal((t, cols)).astype(np.float32)
        for got, lin in zip(linears(lins, x), lins, strict=True):
            assert np.array_equal(got, lin(x))
    raw = random_quantized(QT.Q4_K, (8, cols), g, 1 / np.sqrt(cols))
    other = QuantLinear(
        _T(QT.Q4_K, (8, cols), raw), fmt(QT.Q4_K).vec_dot, bias=np.ones(8, np.float32)
    )
    x = g.standard_normal((5, cols)).astype(np.float32)
    for got, lin in zip(linears([lins[0], other], x), [lins[0], other], strict=True):
        assert np.array_equal(got, lin(x))


def test_host_tier_on_quant_linears_decodes_like_the_float_one(synth_model):
    """First positions of short sequences: float noise apart in nearly all of them (a near tie
    in the router's top-k, flipped by that noise, may move a sequence further)."""
    from strata.cpu.tier import HostTier
    from strata.engine.engine import Engine
    from strata.model.loader import load_model
    from tests.oracle import position_errors

    model = load_model(synth_model("tiny", "Q4_K", seed=5))
    a = model.args
    eng = {d: Engine(model, tier=HostTier(model, n_ctx=16, dense=d)) for d in ("float", "quant")}
    g = np.random.default_rng()
    errs = []
    for _ in range(24):
        toks = g.integers(0, a.n_vocab, 3).tolist()
        la, lb = (eng[d].forward(toks, all_logits=True) for d in ("float", "quant"))
        for e in eng.values():
            e.reset()
        errs.append(position_errors(lb[:1], la[:1])[0])
    errs = np.array(errs)
    assert np.median(errs) < 1e-5 and (errs < 1e-4).mean() >= 0.8, np.sort(errs)[::-1][:6]
    with pytest.raises(ValueError, match="dense must be"):
        HostTier(model, n_ctx=8, dense="fast")
