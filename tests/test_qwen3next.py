"""qwen3next (Qwen3-Next-80B-A3B): metadata, tensor checks, the reference forward and the CPU-only
tier on the tiny synthetic model (3 DeltaNet layers, 1 gated attention layer, a NextN block)."""

from __future__ import annotations

import numpy as np
import pytest

from strata.model.errors import MissingTensor, ModelError
from strata.model.loader import load_model
from strata.model.reference import Reference
from strata.model.reference_hybrid import forward_hybrid, new_state
from strata.model.synth import make_args
from tests.gguf_edit import rewrite_gguf
from tests.oracle import FLIP_BOUND, position_errors


def test_tiny_shape_alternates_deltanet_and_attention():
    a = make_args("tiny-qwen3next")
    assert a.arch == "qwen3next" and a.linear_attn
    assert [a.is_recurrent(i) for i in range(a.n_layer)] == [True, True, True, False]
    assert a.rope_dims == 16 and a.n_nextn == 1 and a.shared_ff == 256


def test_full_size_shape_is_qwen3_next_80b_a3b():
    a = make_args("qwen3-next-80b-a3b")
    assert (a.n_layer, a.n_embd, a.n_expert, a.n_expert_used, a.expert_ff) == (
        48,
        2048,
        512,
        10,
        512,
    )
    assert (a.n_head, a.n_head_kv, a.head_dim, a.rope_dims) == (16, 2, 256, 64)
    assert (a.ssm_n_group, a.ssm_dt_rank, a.ssm_d_state, a.ssm_d_conv) == (16, 32, 128, 4)
    assert sum(not a.is_recurrent(i) for i in range(a.n_layer)) == 12


def test_inconsistent_linear_attention_sizes_are_refused():
    with pytest.raises(ModelError, match="inner_size"):
        make_args("tiny-qwen3next", ssm_d_inner=200)
    with pytest.raises(ModelError, match="time_step_rank"):
        make_args("tiny-qwen3next", ssm_dt_rank=3, ssm_d_inner=192)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from strata.model.synth import SynthSpec, write_synthetic
    from strata.quant import fmt

    spec = SynthSpec(make_args("tiny-qwen3next"), expert_quant=fmt("Q4_K").qtype, seed=3)
    out = tmp_path_factory.mktemp("q3n") / "tiny-qwen3next.gguf"
    return write_synthetic(out, spec, progress=False)[0]


def test_loader_reads_the_file_keys_and_the_nextn_block(tiny):
    m = load_model(tiny)
    a = m.args
    assert a.n_layer == 4 and a.n_nextn == 1  # block_count 5 = 4 trunk + 1 NextN
    assert a.ssm_d_state == 64 and a.ssm_dt_rank == 4 and a.full_attn_interval == 4
    assert m.has("blk.4.nextn.eh_proj.weight") and m.has("blk.0.ssm_a")
    assert m.tensor("blk.3.attn_q.weight").shape == (2 * a.q_dim, a.n_embd)


def test_a_deltanet_layer_without_input_projection_is_refused(tiny, tmp_path):
    bad = tmp_path / "bad.gguf"
    rewrite_gguf(tiny, bad, drop=["blk.1.attn_qkv.weight"])
    with pytest.raises(MissingTensor, match="layer 1"):
        load_model(bad)


def test_reference_prompt_then_decode_equals_the_whole_sequence(tiny):
    """The recurrent state and the KV carried across calls: a prompt, then tokens one by one,
    gives the logits of the whole sequence at once."""
    ref = Reference(load_model(tiny), "exact")
    toks = np.random.default_rng(0).integers(0, 1024, size=9).tolist()
    whole = ref.forward(toks)
    st = new_state(ref)
    parts = [forward_hybrid(ref, toks[:5], state=st)]
    parts += [forward_hybrid(ref, [t], state=st) for t in toks[5:]]
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-10, atol=1e-10)


def test_host_tier_matches_the_reference_and_chunks_equal_one_by_one(tiny):
    """The CPU-only tier's logits agree with the float64 reference that copies llama.cpp's
    roundings to float32 noise (measured ~2e-7 relative); a prompt fed in chunks leaves the
    DeltaNet states (and logits) of the same tokens fed one by one."""
    from strata.engine.engine import Engine

    model = load_model(tiny)
    toks = np.random.default_rng(1).integers(0, 1024, size=8).tolist()
    want = Reference(model, "llama").forward(toks)  # [T, V]
    e1 = Engine(model, n_ctx=64)
    got = e1.forward(toks, all_logits=True)
    errs = position_errors(got, want)  # float32 vs float64 noise; a Q8 flip would be ~1e-3
    assert (errs < 1e-4).mean() >= 0.75 and errs.max() < FLIP_BOUND, errs
    assert (got.argmax(-1) == want.argmax(-1)).all()
    e2 = Engine(model, n_ctx=64)
    e2.forward(toks[:3])
    e2.forward(toks[3:5])
    last = [e2.forward([t]) for t in toks[5:]][-1]
    e3 = Engine(model, n_ctx=64)
    for t in toks:
        one = e3.forward([t])
    # the DeltaNet kernels are bit-exact across cuts (test_deltanet.py); the projections feeding
    # them sum in another order for T = 1 than for T > 1 (gemv vs tiles): float32 noise
    assert position_errors(last[None], one[None])[0] < 1e-5
    for i, s in e2.tier.rec_state.items():
        np.testing.assert_allclose(s, e3.tier.rec_state[i], rtol=0, atol=1e-6)
        np.testing.assert_allclose(e2.tier.conv_state[i], e3.tier.conv_state[i], atol=1e-5)


def test_host_tier_refuses_to_rewind_the_recurrent_state(tiny):
    from strata.cpu.hybrid_tier import RecurrentRewind
    from strata.engine.engine import Engine

    e = Engine(load_model(tiny), n_ctx=64)
    e.forward([1, 2, 3, 4])
    e.reset(keep=2)
    with pytest.raises(RecurrentRewind):
        e.forward([5])
    e.reset()
    e.forward([5])  # a new sequence starts afresh


def test_qwen3next_without_deltanet_sizes_is_refused():
    from strata.model.errors import BadMetadata

    with pytest.raises(BadMetadata, match="ssm"):
        make_args("tiny", "qwen3next")


def test_session_reuses_a_prefix_only_where_the_recurrent_state_stands(tiny):
    """Prefix reuse keeps KV rows per position, a DeltaNet state only whole: a prompt that
    extends the whole history continues it; one that shares part of it starts afresh. Either way
    the logits are those of the prompt run from scratch."""
    from strata.engine.session import Session

    model = load_model(tiny)
    s = Session(model, n_ctx=64)
    fresh = Session(model, n_ctx=64)
    a = [5, 6, 7, 8]
    n, _ = s._prefill(a)
    assert n == 0
    n, got = s._prefill(a + [9, 10])  # extends the history: the state continues
    assert n == 4
    _, want = fresh._prefill(a + [9, 10])
    assert position_errors(got[None], want[None])[0] < 1e-5
    n, got = s._prefill(a[:2] + [11])  # shares 2 tokens: nothing kept
    assert n == 0
    fresh.history = []
    _, want = fresh._prefill(a[:2] + [11])
    np.testing.assert_array_equal(got, want)


def test_kv_cache_counts_attention_layers_and_the_recurrent_state_its_own(tiny):
    m = load_model(tiny)
    a = m.args
    assert m.kv_bytes(100) == 1 * 100 * a.n_head_kv * (a.head_dim + a.v_head_dim) * 2
    c = 2 * 2 * 64 + 256
    assert m.recurrent_bytes() == 3 * (3 * c + 4 * 64 * 64) * 4


def legacy_copy(src, dst, a) -> None:
    """`src` with every DeltaNet layer's attn_qkv + attn_gate fused into the legacy ssm_in (per
    key head [q, k, v, z] rows), as older converters wrote it: the same rows, reordered."""
    import gguf

    r = gguf.GGUFReader(src)
    t = {x.name: x for x in r.tensors}
    hk, dk, rv = a.ssm_n_group, a.ssm_d_state, a.ssm_d_inner // a.ssm_n_group
    drop, extra = [], {}
    for i in range(a.n_layer):
        if not a.is_recurrent(i):
            continue
        qkv, z = t[f"blk.{i}.attn_qkv.weight"], t[f"blk.{i}.attn_gate.weight"]
        assert qkv.tensor_type == z.tensor_type
        rows_qkv, rows_z = np.asarray(qkv.data), np.asarray(z.data)  # [rows, row bytes]
        parts = []
        for g in range(hk):
            parts += [rows_qkv[g * dk : (g + 1) * dk], rows_qkv[(hk + g) * dk : (hk + g + 1) * dk]]
            parts.append(rows_qkv[2 * hk * dk + g * rv : 2 * hk * dk + (g + 1) * rv])
            parts.append(rows_z[g * rv : (g + 1) * rv])
        drop += [qkv.name, z.name]
        extra[f"blk.{i}.ssm_in.weight"] = (np.concatenate(parts), int(qkv.tensor_type))
    del r
    rewrite_gguf(src, dst, drop=drop, extra_tensors=extra)


def test_legacy_fused_ssm_in_gives_the_same_logits(tiny, tmp_path):
    """A file with ssm_in (older converters) in place of attn_qkv + attn_gate: the reference and
    the CPU-only tier give the split file's logits."""
    from strata.engine.engine import Engine

    split = load_model(tiny)
    legacy_path = tmp_path / "legacy.gguf"
    legacy_copy(tiny, legacy_path, split.args)
    legacy = load_model(legacy_path)
    assert legacy.has("blk.0.ssm_in.weight") and not legacy.has("blk.0.attn_qkv.weight")
    toks = [3, 700, 21, 900, 5]
    want = Reference(split, "exact").forward(toks)
    np.testing.assert_allclose(
        Reference(legacy, "exact").forward(toks), want, rtol=0, atol=1e-10 * np.abs(want).max()
    )
    got = Engine(legacy, n_ctx=32).forward(toks, all_logits=True)
    ref = Engine(split, n_ctx=32).forward(toks, all_logits=True)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_qwen35moe_reads_beta_alpha_and_tiles_value_heads(tmp_path):
    """qwen35moe: separate ssm_beta / ssm_alpha, no ssm_ba or legacy ssm_in, value heads tiled
    over the key heads, the RoPE sections from the file."""
    from strata.model.arch import qwen35moe
    from strata.model.synth import SynthSpec, write_synthetic

    a = make_args("tiny-qwen35moe")
    assert a.v_heads_tiled and a.rope_sections == (3, 3, 2, 0)
    t = qwen35moe.layer_tensors(a, 0)
    assert t["blk.0.ssm_beta.weight"] == (4, 256) and "blk.0.ssm_ba.weight" not in t
    assert "blk.0.ssm_in.weight" not in t and "blk.0.attn_qkv.weight" not in qwen35moe.OPTIONAL
    path = write_synthetic(tmp_path / "q35.gguf", SynthSpec(a, seed=1), progress=False)[0]
    m = load_model(path)
    assert m.args.v_heads_tiled and m.args.rope_sections == (3, 3, 2, 0) and m.args.n_nextn == 1
    x = np.arange(2 * 3).reshape(1, 2, 3)  # [T, Hk, Dk]
    from strata.model.reference_hybrid import value_head_keys

    assert value_head_keys(a, x)[0, :, 0].tolist() == [0, 3, 0, 3]  # j % Hk
    assert value_head_keys(make_args("tiny-qwen3next"), x)[0, :, 0].tolist() == [0, 0, 3, 3]


def test_host_tier_keeps_kv_rows_for_attention_layers_only(tiny):
    """One attention layer of four (and the NextN block's): two layers of KV rows, not five, in
    f16 or int8 (both give the reference's greedy tokens here)."""
    from strata.cpu.hybrid_tier import make_host_tier
    from strata.engine.engine import Engine

    model = load_model(tiny)
    toks = [9, 99, 999, 5, 55]
    want = Reference(model, "llama").forward(toks).argmax(-1)
    for kv in ("f16", "int8"):
        tier = make_host_tier(model, 32, kv_type=kv)
        assert tier.k_cache.shape[0] == 2 and tier.kv_row == {3: 0, 4: 1}  # 4: the NextN block
        got = Engine(model, tier).forward(toks, all_logits=True)
        assert (got.argmax(-1) == want).all(), kv


def test_host_tier_nextn_draft_matches_the_reference(tiny):
    """The CPU-only tier's NextN block (its own KV row, its experts on the tier) gives the
    reference's draft logits, in one call and in two (the KV carried)."""
    from strata.cpu.hybrid_tier import make_host_tier
    from strata.model.reference_hybrid import forward_nextn, trunk_hidden

    model = load_model(tiny)
    ref = Reference(model, "llama")
    toks = [17, 230, 512, 8, 1000, 3]
    h = trunk_hidden(ref, toks).astype(np.float32)  # [T, D]
    nxt = toks[1:] + [77]
    want = forward_nextn(ref, h.astype(np.float64), nxt, np.arange(6))
    tier = make_host_tier(model, 32)
    got = tier.nextn(h, np.array(nxt), 0)
    errs = position_errors(got, want)
    # as the llama.cpp oracle tests allow: a Q8 activation rounding may flip (f32 noise in the
    # trunk's hidden rows decides it), never more than a flip's size
    assert (errs < 1e-4).mean() >= 0.6 and errs.max() < FLIP_BOUND, errs
    assert (got.argmax(-1) == want.argmax(-1)).all()
    tier2 = make_host_tier(model, 32)
    two = np.concatenate(
        [tier2.nextn(h[:4], np.array(nxt[:4]), 0), tier2.nextn(h[4:], np.array(nxt[4:]), 4)]
    )
    assert position_errors(two, got).max() < 1e-5


def test_host_tier_snapshot_restores_the_recurrent_state(tiny):
    """A snapshot taken after a prefix, restored after the sequence went on elsewhere, continues
    as if the other tokens had never run."""
    from strata.engine.engine import Engine

    model = load_model(tiny)
    e = Engine(model, n_ctx=32)
    e.forward([4, 40, 400])
    snap = e.tier.snapshot()
    want = e.forward([7])
    e.forward([8, 9])  # another continuation
    e.reset(keep=e.tier.restore(snap))
    assert e.pos == 3
    np.testing.assert_array_equal(e.forward([7]), want)
