"""gpt-oss: the file's metadata and tensors, the reference's new pieces, and the CPU-only engine
(host tier) against the float64 reference on a tiny synthetic model whose sliding window (8) is
shorter than the prompts."""

from __future__ import annotations

import dataclasses

import pytest
from gguf.constants import MODEL_TENSOR as MT

from strata.model.errors import MissingTensor
from strata.model.loader import load_model
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
