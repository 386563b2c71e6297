"""gpt-oss: the file's metadata and tensors, the reference's new pieces, and the CPU-only engine
(host tier) against the float64 reference on a tiny synthetic model whose sliding window (8) is
shorter than the prompts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gguf.constants import MODEL_TENSOR as MT

from strata.cpu.rope import rope_table
from strata.cpu.rope import swiglu_oai as swiglu_oai_f32
from strata.model import ref_gpt_oss as oss
from strata.model.errors import MissingTensor
from strata.model.loader import load_model
from strata.model.reference import Reference
from strata.model.synth import make_args
from strata.routing.topk import topk_softmax_weight
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


@pytest.mark.parametrize("llama", [False, True])
def test_host_rope_table_is_the_reference_yarn(llama):
    a = make_args(SHAPE)
    pos = np.arange(0, 3000, 37, dtype=np.float64)
    theta, mscale = oss.rope_angles(a, pos, llama)
    assert mscale == pytest.approx(1 + 0.1 * np.log(32), rel=1e-6)  # cos/sin grow with YaRN
    tab = rope_table(a)
    assert tab.mscale == pytest.approx(mscale, rel=1e-6)
    cos = np.concatenate([tab.cos_sin(int(p), 1)[0] for p in pos])  # [T, Dh/2]
    np.testing.assert_allclose(cos, np.cos(theta) * mscale, atol=2e-5 if llama else 2e-4)
    # high-frequency pairs keep their angle, low-frequency ones are divided by the factor
    inv = a.rope_theta ** (-np.arange(a.head_dim // 2) * 2.0 / a.head_dim)
    assert theta[1, 0] == pytest.approx(pos[1] * inv[0], rel=1e-6)
    assert theta[1, -1] == pytest.approx(pos[1] * inv[-1] / 32, rel=1e-5)


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
    got = swiglu_oai_f32(g.astype(np.float32), u.astype(np.float32))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert oss.swiglu_oai(np.array([50.0]), np.array([-50.0]), False)[0] < 0  # up clamped to -7


def test_softmax_weight_gating_softmaxes_the_picked_logits_only():
    rng = np.random.default_rng()
    logits = rng.standard_normal((9, 16)).astype(np.float32)
    ids, w, probs = topk_softmax_weight(logits, 4)
    rid, rw = oss.softmax_weight_topk(logits.astype(np.float64), 4)
    assert (ids == rid).all() and probs.shape == (9, 16)
    np.testing.assert_allclose(w, rw, rtol=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
    assert (np.sort(logits, -1)[:, ::-1][:, :4] == np.take_along_axis(logits, ids, -1)).all()


def test_the_sliding_window_matters_past_it_and_only_there(synth_model):
    """Two files alike but for the window (8, and wider than the prompt): the same logits up to
    position 8, others from there on (the sliding layer's first position that loses a key)."""
    tokens = np.random.default_rng().integers(0, 1024, size=14).tolist()
    slid = Reference(load_model(synth_model(SHAPE, "Q8_0", seed=5)), "exact").forward(tokens)
    wide = load_model(synth_model(SHAPE, "Q8_0", seed=5, sliding_window=4096))
    full = Reference(wide, "exact").forward(tokens)
    np.testing.assert_allclose(slid[:8], full[:8], rtol=1e-10, atol=1e-10)
    assert (np.abs(slid[8:] - full[8:]).max(-1) > 1e-3).all()


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
def test_cpu_pool_experts_match_the_host_tier(synth_model, quant):
    """The CPU pool's kernels with gpt-oss's expert biases and clamped SwiGLU against the host
    tier's float path (HostTier.experts), on one token, a few and a prompt's worth: most rows
    agree to float noise; a Q8 rounding flip of the intermediate (the two sum in other orders)
    moves a row by ~1e-4 of the output, no more."""
    from strata.cpu.runner import PoolMissRunner
    from strata.cpu.tier import HostTier

    model = load_model(synth_model(SHAPE, quant, seed=4))
    a = model.args
    tier, pool = HostTier(model, n_ctx=8), PoolMissRunner(model, 2)
    assert pool.layers[0].glu == 1 and pool.layers[1].down_bias.shape == (a.n_expert, a.n_embd)
    rng = np.random.default_rng()
    errs = []
    for t in (1, 3, 40):
        h = rng.standard_normal((t, a.n_embd)).astype(np.float32)
        ids = np.stack([rng.permutation(a.n_expert)[: a.n_expert_used] for _ in range(t)])
        ids = ids.astype(np.int32)
        ids[0, -1] = -1  # a pick the tier serves: skipped
        w = rng.random((t, a.n_expert_used)).astype(np.float32)
        for layer in range(a.n_layer):
            want = tier.experts(layer, h, ids, w)
            got = pool.experts(layer, h, ids, w)
            errs.append(np.abs(got - want).max(-1) / np.abs(want).max())  # per row [T]
    errs = np.concatenate(errs)
    assert (errs <= 1e-5).mean() >= 0.8 and errs.max() <= 2e-3, np.sort(errs)[::-1][:8]


def test_cpu_only_build_runs_gpt_oss_on_the_cpu_pool(synth_model):
    """`strata generate` on a CPU: the experts in the CPU pool (the compiled one-call decode
    step stays qwen3moe's: eager steps here), the same greedy tokens as the reference forward
    on the growing sequence, in the engine's own numerics (llama's Q8 roundings: against the
    exact numerics a rounding near a tie flipped a token in about one run of two)."""
    from strata.build import build_engine
    from strata.config import resolve
    from strata.cpu.runner import PoolMissRunner

    model = load_model(synth_model(SHAPE, "Q8_0", seed=11))
    eng = build_engine(model, resolve(dict(device="host", n_ctx=64), {}))
    assert isinstance(eng.miss_runner, PoolMissRunner) and eng.host_step is None
    prompt = np.random.default_rng().integers(0, model.args.n_vocab, size=10).tolist()
    seq = list(prompt)
    tok = int(np.argmax(eng.forward(prompt)))
    for _ in range(4):
        seq.append(tok)
        tok = eng.decode_greedy(tok)
    seq.append(tok)
    ref = Reference(model, "llama").forward(seq[:-1])
    assert ref[len(prompt) - 1 :].argmax(-1).tolist() == seq[len(prompt) :]
