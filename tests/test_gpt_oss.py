"""gpt-oss: the file's metadata and tensors, the reference's new pieces, and the CPU-only engine
(host tier) against the float64 reference on a tiny synthetic model whose sliding window (8) is
shorter than the prompts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf.constants import MODEL_TENSOR as MT

from strata.model import ref_gpt_oss as oss
from strata.model.errors import MissingTensor
from strata.model.loader import load_model
from strata.model.reference import Reference
from strata.model.synth import make_args
from tests.gguf_edit import rewrite_gguf

SHAPE = "tiny-gpt-oss"


def test_model_args_match_the_synthetic_shape(synth_model):
    model = load_model(synth_model(SHAPE, "Q8_0"))
    want = make_args(SHAPE)
    for f in dataclasses.fields(want):
        if f.name == "extra":
            continue
        got, exp = getattr(model.args, f.name), getattr(want, f.name)
        assert got == (pytest.approx(exp, rel=1e-6) if isinstance(exp, float) else exp), f.name
    a = model.args
    assert (a.sliding_window, a.swa_layers) == (8, (True, False))  # llama.cpp: even layers slide
    assert a.window(0) == 8 and a.window(1) == 0
    assert (a.rope_scaling, a.rope_factor, a.rope_orig_ctx) == ("yarn", 32.0, 4096)
    assert a.attn_sinks and a.o_bias and a.router_bias and a.expert_bias and not a.qk_norm
    # the FFN norm is stored as post_attention_norm
    assert model.tensor(MT.FFN_NORM, 1).name == "blk.1.post_attention_norm.weight"


def test_a_file_without_its_attention_sinks_is_refused(synth_model, tmp_path):
    src = synth_model(SHAPE, "Q8_0")
    bad = rewrite_gguf(src, tmp_path / "nosinks.gguf", drop={"blk.1.attn_sinks.weight"})
    with pytest.raises(MissingTensor, match="blk.1.attn_sinks.weight"):
        load_model(bad)


def test_sinks_take_a_share_of_the_softmax():
    rng = np.random.default_rng()
    scores = rng.standard_normal((3, 5, 7))  # [H, T, S]
    scores[:, :, 5:] = -np.inf
    sinks = rng.standard_normal(3)
    p = oss.softmax_with_sinks(scores, sinks)
    full = np.concatenate([scores, np.broadcast_to(sinks[:, None, None], (3, 5, 1))], -1)
    want = np.exp(full - full.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(p, want[..., :-1], rtol=1e-12)
    assert (p.sum(-1) < 1).all() and (p[..., 5:] == 0).all()
    np.testing.assert_allclose(oss.softmax_with_sinks(scores, None).sum(-1), 1.0)


def test_swiglu_oai_clamps_gate_above_and_up_both_ways():
    rng = np.random.default_rng()
    g, u = 6 * rng.standard_normal(1000), 6 * rng.standard_normal(1000)
    want = np.minimum(g, 7) / (1 + np.exp(-1.702 * np.minimum(g, 7))) * (np.clip(u, -7, 7) + 1)
    np.testing.assert_allclose(oss.swiglu_oai(g, u, False), want, rtol=1e-12)
    np.testing.assert_allclose(oss.swiglu_oai(g, u, True), want, rtol=1e-5, atol=1e-6)
    assert oss.swiglu_oai(np.array([50.0]), np.array([-50.0]), False)[0] < 0  # up clamped to -7


def test_the_sliding_window_matters_past_it_and_only_there(synth_model):
    """Two files alike but for the window (8, and wider than the prompt): the same logits up to
    position 8, others from there on (the sliding layer's first position that loses a key)."""
    tokens = np.random.default_rng().integers(0, 1024, size=14).tolist()
    slid = Reference(load_model(synth_model(SHAPE, "Q8_0", seed=5)), "exact").forward(tokens)
    wide = load_model(synth_model(SHAPE, "Q8_0", seed=5, sliding_window=4096))
    full = Reference(wide, "exact").forward(tokens)
    np.testing.assert_allclose(slid[:8], full[:8], rtol=1e-10, atol=1e-10)
    assert (np.abs(slid[8:] - full[8:]).max(-1) > 1e-3).all()
