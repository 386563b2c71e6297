"""Placement without a profile: a prompt's own picks re-place the adaptive expert cache before
its decode (`AdaptiveCache.warm`), which never changes what is computed, only where."""

from __future__ import annotations

import numpy as np
import pytest

from strata.build import build_engine
from strata.config import resolve
from strata.cpu.runner import PoolMissRunner
from strata.cpu.tier import HostTier
from strata.engine.engine import Engine
from strata.engine.synth_routing import write_routed
from strata.model.loader import load_model
from strata.model.synth import SynthSpec, make_args, topic_range
from strata.quant import fmt
from strata.routing.profile import AdaptiveCache, UsageProfile


def test_warm_swaps_the_hottest_misses_for_the_coldest_residents_while_they_beat_them():
    resident = np.zeros((1, 8), bool)
    resident[0, :4] = True  # experts 0-3 held
    cache = AdaptiveCache(resident, max_swaps=1)
    # a prompt of 60 tokens, 2 picks each: 7 and 6 hot, 5 lukewarm, 0 and 1 held and warm
    ids = np.array([[7, 6]] * 30 + [[0, 1]] * 20 + [[5, 0]] * 10)
    swaps = cache.warm(0, ids)
    assert sorted(e for _, e in swaps) == [6, 7]  # 5 beats no resident by the margin
    assert {c for c, _ in swaps} == {2, 3}  # the coldest residents went
    assert resident[0].sum() == 4 and resident[0, [0, 1, 6, 7]].all()
    assert cache.swaps_in_window == 0  # a prompt's swaps leave the decode's allowance alone
    assert cache.warm(0, ids) == []  # placed: the same prompt again moves nothing


def test_a_static_cache_stays_static_through_prompts(model):
    a = model.args
    few = np.zeros((a.n_layer, a.n_expert), bool)
    few[:, :8] = True
    eng = _engine(model, True, few.copy(), same_numerics=True)
    eng.adaptive.max_swaps = 0  # --adapt-swaps 0
    eng.forward(np.random.default_rng(9).integers(0, a.n_vocab, 64).tolist())
    assert eng.stats.warm_swaps == 0 and (eng.resident == few).all()


def _routed_model(tmp_path):
    args = make_args("tiny", n_expert=32, n_expert_used=4, n_layer=2)
    spec = SynthSpec(args, fmt("Q4_K").qtype, seed=3, routing_entropy=0.93)
    return load_model(write_routed(tmp_path / "r.gguf", spec, progress=False)[0][0])


def _engine(model, warm: bool | None, resident, same_numerics: bool):
    """warm None: a static cache; else the adaptive cache with or without prompt warming.
    same_numerics: the tier serves the misses too (placement then cannot change one bit)."""
    tier = HostTier(model, n_ctx=200)
    adaptive = None
    if warm is not None:
        adaptive = AdaptiveCache(resident, max_swaps=8, warm_from_prompts=warm)
    runner = None if same_numerics else PoolMissRunner(model, 1, skip=resident)
    return Engine(model, tier, miss_runner=runner, resident=resident, adaptive=adaptive)


def _run(eng, prompt, stream):
    """Prompt, then decode fed `stream` -> the logits of every step [1 + len(stream), V]."""
    out = [eng.forward(prompt)]
    out += [eng.forward([t]) for t in stream]
    return np.array(out)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _routed_model(tmp_path_factory.mktemp("warm"))


def test_a_warmed_cache_computes_the_same_bits(model):
    a = model.args
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, a.n_vocab, 64).tolist()
    stream = rng.integers(0, a.n_vocab, 12).tolist()
    few = np.zeros((a.n_layer, a.n_expert), bool)
    few[:, :8] = True
    runs = {w: _engine(model, w, few.copy(), same_numerics=True) for w in (None, False, True)}
    logits = {w: _run(e, prompt, stream) for w, e in runs.items()}
    assert runs[True].stats.warm_swaps > 0 and runs[False].stats.warm_swaps == 0
    np.testing.assert_array_equal(logits[True], logits[None])
    np.testing.assert_array_equal(logits[False], logits[None])


def test_a_prompt_of_one_distribution_warms_the_cache_for_its_decode(model):
    a = model.args
    lo, hi = topic_range(a.n_vocab, 1)
    rng = np.random.default_rng(6)
    prompt = rng.integers(lo, hi, 128).tolist()
    stream = rng.integers(lo, hi, 48).tolist()
    few = np.zeros((a.n_layer, a.n_expert), bool)
    few[:, :10] = True
    rates = {}
    for warm in (None, False, True):
        eng = _engine(model, warm, few.copy(), same_numerics=False)
        eng.forward(prompt)
        h0, m0 = eng.stats.hits, eng.stats.misses
        for t in stream:
            eng.forward([t])
        h, m = eng.stats.hits - h0, eng.stats.misses - m0
        rates[warm] = h / (h + m)
    assert rates[True] > rates[False] + 0.1 and rates[True] > rates[None] + 0.1, rates


def test_a_usage_profile_keeps_its_placement_through_prompts(model, tmp_path):
    a = model.args
    counts = np.random.default_rng(7).integers(0, 100, (a.n_layer, a.n_expert))
    UsageProfile(counts).save(tmp_path / "p.json")
    flags = dict(device="host", expert_cache="16", n_ctx=80, car_threshold=1.0)
    with_profile = build_engine(model, resolve(dict(flags, profile=str(tmp_path / "p.json")), {}))
    without = build_engine(model, resolve(flags, {}))
    assert not with_profile.adaptive.warm_from_prompts and without.adaptive.warm_from_prompts
    placed = with_profile.resident.copy()
    with_profile.forward(np.random.default_rng(8).integers(0, a.n_vocab, 64).tolist())
    assert with_profile.stats.warm_swaps == 0
    np.testing.assert_array_equal(with_profile.resident, placed)
