"""The host engine against the float64 reference; sampling; the generation session."""

from __future__ import annotations

import numpy as np
import pytest

from strata.engine.engine import Engine
from strata.engine.sampling import Sampler, SamplingParams
from strata.engine.session import Generation, Session
from strata.model.loader import load_model
from strata.model.reference import Reference
from strata.routing import route_topk
from tests.oracle import assert_logits_match, position_errors, routed_apart, trace_ids


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize(
    "arch,quant",
    [
        ("qwen3moe", "IQ3_XXS"),
        ("qwen3moe", "Q6_K"),
        ("qwen2moe", "Q4_K"),
        ("gpt-oss", "Q8_0"),
        ("gpt-oss", "Q4_K"),
    ],
)
def test_engine_logits_match_reference_prefill_and_cached_decode(
    synth_model, tmp_path, arch, quant
):
    """The engine against the reference with llama numerics: sequences of 7 at once, then
    prefill 4 and one token at a time through the KV cache. gpt-oss with a window of 4, so
    positions 4.. are past it. Short sequences: a Q8 rounding flip spoils only its own."""
    if arch == "gpt-oss":
        model = load_model(synth_model("tiny-gpt-oss", quant, seed=3, sliding_window=4))
        assert model.args.window(0) == 4
    else:
        model = load_model(synth_model("tiny", quant, arch=arch, seed=3))
    n_layer = model.args.n_layer
    rng = np.random.default_rng()
    reference = Reference(model, "llama")
    errs, step_errs, apart, step_apart = [], [], [], []
    for i in range(12):
        tokens = rng.integers(0, model.args.n_vocab, size=7).tolist()
        ref_ids: list[np.ndarray] = []
        ref = reference.forward(tokens, record=ref_ids)  # [T, V]
        full_trace, step_trace = tmp_path / f"full{i}.strcs", tmp_path / f"step{i}.strcs"
        eng = Engine(model, n_ctx=64, trace_path=str(full_trace))
        full = eng.forward(tokens, all_logits=True)
        eng.close()
        errs.append(position_errors(full, ref))
        apart.append(routed_apart(trace_ids(full_trace, n_layer), ref_ids))
        # prefill 4, then one token at a time through the KV cache: the same logits
        eng = Engine(model, n_ctx=64, trace_path=str(step_trace))
        step = [eng.forward(tokens[:4])] + [eng.forward([t]) for t in tokens[4:]]
        eng.close()
        step_errs.append(position_errors(np.stack(step), full[3:]))
        step_apart.append(
            routed_apart(trace_ids(step_trace, n_layer), trace_ids(full_trace, n_layer))[3:]
        )
        assert eng.pos == len(tokens)
    assert_logits_match(np.concatenate(errs), 1e-5, apart=np.concatenate(apart))
    assert_logits_match(np.concatenate(step_errs), 1e-5, apart=np.concatenate(step_apart))


def test_llama_numerics_differ_from_exact_by_rounding_only(synth_model):
    model = load_model(synth_model("tiny", "Q4_K", seed=4))
    tokens = np.random.default_rng().integers(0, model.args.n_vocab, size=8).tolist()
    ids_a: list[np.ndarray] = []
    ids_b: list[np.ndarray] = []
    a = Reference(model, "llama").forward(tokens, record=ids_a)
    b = Reference(model, "exact").forward(tokens, record=ids_b)
    assert rel_err(a, b) > 1e-6
    # rounding moves logits by less than 5e-2 until a router near-tie picks another expert
    same = ~routed_apart(ids_a, ids_b)
    if same.any():
        assert rel_err(a[same], b[same]) < 5e-2


def test_route_topk_matches_naive_softmax_topk():
    rng = np.random.default_rng()
    logits = rng.standard_normal((5, 16)).astype(np.float32) * 3
    ids, w, probs = route_topk(logits, 4, renormalize=True)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = np.argsort(-p, axis=1)[:, :4]
    assert (ids == want).all()
    np.testing.assert_allclose(
        w,
        np.take_along_axis(p, want, 1) / np.take_along_axis(p, want, 1).sum(1, keepdims=True),
        rtol=1e-5,
    )
    _, w2, _ = route_topk(logits, 4, renormalize=False)
    np.testing.assert_allclose(w2, np.take_along_axis(p, want, 1), rtol=1e-5)


def test_context_overflow_is_a_clear_error(synth_model):
    eng = Engine(load_model(synth_model("tiny", "Q4_K")), n_ctx=8)
    eng.forward(list(range(8)))
    with pytest.raises(ValueError, match="context full"):
        eng.forward([1])


def test_sampling_greedy_seeded_and_filters():
    rng = np.random.default_rng()
    logits = rng.standard_normal(100).astype(np.float32)
    assert Sampler(SamplingParams())(logits) == int(np.argmax(logits))
    assert Sampler(SamplingParams(temperature=1.0, top_k=1))(logits) == int(np.argmax(logits))
    p = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    a = [Sampler(p)(logits) for _ in range(3)]
    s1, s2 = Sampler(p), Sampler(p)
    assert [s1(logits) for _ in range(20)] == [s2(logits) for _ in range(20)]
    assert len(set(a)) == 1
    # min_p keeps only tokens with p >= min_p * p_max
    peaked = np.full(50, -10.0, np.float32)
    peaked[[3, 7]] = [5.0, 4.5]
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.3, seed=1))
    assert {s(peaked) for _ in range(200)} == {3, 7}
    # top_p: the smallest set whose mass reaches top_p
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, seed=2))
    assert {s(peaked) for _ in range(100)} == {3}


def test_temperature_sampling_follows_softmax():
    logits = np.array([2.0, 1.0, 0.0, -1.0], np.float32)
    s = Sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5))
    counts = np.bincount([s(logits) for _ in range(4000)], minlength=4) / 4000
    p = np.exp(logits) / np.exp(logits).sum()
    assert np.abs(counts - p).max() < 0.03


@pytest.mark.parametrize(
    "bad", [dict(temperature=-1), dict(top_p=0), dict(min_p=2), dict(top_k=-3)]
)
def test_sampling_params_refuse_bad_values(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_session_streams_stops_and_reuses_prefix(synth_model):
    model = load_model(synth_model("tiny", "Q4_K", seed=5))
    s = Session(model, n_ctx=128)
    res = Generation()
    text = "".join(s.generate("hello world", 12, result=res))
    assert text == res.text and len(res.tokens) <= 12
    assert res.finish_reason in ("stop", "length")
    # the same prompt again reuses all but one prompt token and gives the same text
    res2 = Generation()
    assert "".join(s.generate("hello world", 12, result=res2)) == text
    assert res2.reused_tokens == res2.prompt_tokens - 1
    # a stop string taken from the output cuts it there and is not emitted
    if len(text) > 4:
        stop = text[2:4]
        res3 = Generation()
        out = "".join(
            Session(model, n_ctx=128).generate("hello world", 12, stop=[stop], result=res3)
        )
        assert out == text[: text.find(stop)] and res3.finish_reason == "stop"


def test_skewed_synthetic_model_concentrates_expert_use(synth_model):
    def top_share(skew):
        model = load_model(synth_model("tiny", "Q4_K", seed=9, skew=skew, n_expert=16))
        eng = Engine(model, n_ctx=256)
        eng.forward(np.random.default_rng(0).integers(0, model.args.n_vocab, 200).tolist())
        h = np.sort(eng.stats.expert_hist.sum(0))[::-1]
        return h[:4].sum() / h.sum()

    assert top_share(2.0) > top_share(0.0) + 0.1


def test_decode_greedy_is_the_argmax_of_the_next_logits(synth_model):
    """decode_greedy (the GPU tier takes the argmax on the card) == argmax(forward) on the host
    tier, step for step, and refuses what forward refuses."""
    model = load_model(synth_model("tiny", "Q4_K", seed=41))
    a, b = Engine(model, n_ctx=40), Engine(model, n_ctx=40)
    prompt = np.random.default_rng().integers(0, model.args.n_vocab, 5).tolist()
    tok = int(np.argmax(a.forward(prompt)))
    assert tok == int(np.argmax(b.forward(prompt)))
    for _ in range(10):
        nxt = a.decode_greedy(tok)
        assert nxt == int(np.argmax(b.forward([tok])))
        tok = nxt
    assert a.pos == b.pos == 15 and a.stats.decode_steps == b.stats.decode_steps == 10
    with pytest.raises(ValueError, match="out of range"):
        a.decode_greedy(model.args.n_vocab)
    a.pos = a.n_ctx
    with pytest.raises(ValueError, match="context full"):
        a.decode_greedy(tok)


class _FakeCard:
    """What the engine reads of a GPU tier when it chooses its decode step (nothing runs)."""

    name = "cupy"
    n_ctx, stage_n = 64, 0

    def __init__(self, all_resident: bool, routes: bool = True):
        self.all_resident, self._routes = all_resident, routes

    def routes_on_device(self) -> bool:
        return self._routes

    def moe_on_card_ok(self) -> bool:
        return self.all_resident

    def to_host(self, a):
        return a

    def to_device(self, a):
        return a

    def prefetch(self, layer, e, evict=None):
        pass


def test_the_decode_step_is_chosen_once_from_the_tier_and_the_config(tmp_path):
    from types import SimpleNamespace

    from strata.cpu.runner import PoolMissRunner
    from strata.engine.steps import (
        AllResidentGraphStep,
        EagerStep,
        HostRoutedGraphStep,
        RoutedGraphStep,
    )
    from strata.routing.profile import AdaptiveCache

    args = SimpleNamespace(n_layer=2, n_expert=8, n_expert_used=2, n_ctx_train=64)
    model = SimpleNamespace(args=args)
    pool = object.__new__(PoolMissRunner)  # a CPU pool (its step server), never called here
    other = SimpleNamespace(experts=None)  # a miss runner without a step server
    few = np.zeros((2, 8), bool)
    few[:, :3] = True

    def step(tier, **kw):
        eng = Engine(model, tier, **kw)
        assert eng.graph_step is (None if eng.step is eng.eager else eng.step)
        return eng.step

    all_card, part_card = _FakeCard(True), _FakeCard(False)
    assert isinstance(step(all_card), AllResidentGraphStep)
    assert isinstance(step(all_card, graphs=False), EagerStep)
    eng = Engine(model, all_card)
    assert eng.eager.picks_on_card and eng.eager.grouped
    traced = step(all_card, trace_path=str(tmp_path / "t.strcs"))
    assert isinstance(traced, HostRoutedGraphStep)  # the trace needs the host's scores
    routed = step(part_card, miss_runner=pool, resident=few)
    assert isinstance(routed, RoutedGraphStep) and routed._make_server is not None
    assert step(part_card, miss_runner=other, resident=few)._make_server is None
    adaptive = AdaptiveCache(few.copy(), max_swaps=4)
    kw = dict(miss_runner=pool, resident=adaptive.resident, adaptive=adaptive)
    assert isinstance(step(part_card, **kw), RoutedGraphStep)  # observed after each step
    assert isinstance(step(part_card, device_routing=False, **kw), HostRoutedGraphStep)
    assert isinstance(step(_FakeCard(False, routes=False), **kw), HostRoutedGraphStep)
    # a card that serves its own misses by uploads on demand, and the CPU-only tier: eager
    assert isinstance(step(part_card, resident=few), EagerStep)
    host = _FakeCard(True)
    host.name = "host"
    eng = Engine(model, host, miss_runner=pool, resident=few)
    assert isinstance(eng.step, EagerStep) and not eng.eager.picks_on_card


def test_the_plan_record_layout():
    """ids0 | ids | weights | pair_slot [K] | stats [4] | h [D]: views share the record's words."""
    from strata.quant.plan_record import N_STATS, offsets, plan_views, record_views, words

    k, d = 3, 5
    assert words(k, d) == 4 * k + 4 + d and N_STATS == 4
    assert offsets(k) == (0, k, 2 * k, 3 * k, 4 * k, 4 * k + 4)
    recs = np.arange(2 * words(k, d), dtype=np.uint32).reshape(2, -1)
    v, one = record_views(recs, k), plan_views(recs[1], k)
    assert v["h"].shape == (2, d) and one["h"].shape == (1, d) and one["ids"].shape == (k,)
    for name, dtype in [("ids0", np.int32), ("weights", np.float32), ("stats", np.float32)]:
        assert v[name].dtype == one[name].dtype == dtype and np.shares_memory(v[name], recs)
    np.testing.assert_array_equal(one["pair_slot"], recs[1, 3 * k : 4 * k].view(np.int32))
    np.testing.assert_array_equal(v["h"][1], recs[1, 4 * k + 4 :].view(np.float32))
