"""The sampling chain the card runs (strata/gpu/sample.py `sample_ref`, the kernel's reference and
the host Sampler's math): against a plain-Python spelling of it, against the float chain the
Sampler used before, as an inverse CDF; the Sampler's one-u-per-token draw; and the engine and
session paths that sample through the tier (the host tier here; the card: test_gpu_sample.py).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from strata.cpu.sampling import kept_ref, order_keys, sample_ref
from strata.engine.engine import Engine
from strata.engine.sampling import Sampler, SamplingParams
from strata.engine.session import Generation, Session
from strata.gpu.sample import knob_values
from strata.model.loader import load_model


def knobs(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    return SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


def naive(z: np.ndarray, p, u: float) -> int:
    """The chain spelled out in Python: full sort, integer sums, linear scans."""
    zs = [float(x) for x in z]
    v = len(zs)
    if p.temperature == 0:
        return max(range(v), key=lambda i: (zs[i], -i))
    order = sorted(range(v), key=lambda i: (-zs[i], i))  # -0.0 == 0.0: lower index first
    m = zs[order[0]]

    def fix(e: float) -> int:
        return math.floor(e * 2.0**40 + 0.5)

    def rel(x: float, t: float) -> float:
        return 1.0 if x == m else math.exp((x - m) / t)

    cand = order[: p.top_k if 0 < p.top_k < v else v]
    q = [fix(rel(zs[i], 1.0)) for i in cand]
    if p.top_p < 1:
        s = sum(q)
        t = max(min(math.ceil(p.top_p * float(s)), s), 1)
        keep, run = 0, 0
        while run < t:
            run += q[keep]
            keep += 1
        cand, q = cand[:keep], q[:keep]
    kept = sorted(i for i, x in zip(cand, q, strict=True) if x >= p.min_p * 2.0**40)
    r = [fix(rel(zs[i], p.temperature)) for i in kept]
    w = sum(r)
    t = min(math.floor(u * float(w)), w - 1)
    run = 0
    for i, x in zip(kept, r, strict=True):
        run += x
        if run > t:
            return i
    raise AssertionError("unreachable: the running sum ends at w > t")


def old_kept(z: np.ndarray, p) -> np.ndarray:
    """The ids the Sampler kept before the chain went to fixed point (float64, normalized)."""
    zz = z.astype(np.float64)
    cand = np.argsort(-zz, kind="stable")
    if p.top_k:
        cand = cand[: p.top_k]
    probs = np.exp(zz[cand] - zz[cand[0]])
    probs /= probs.sum()
    if p.top_p < 1:
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        cand, probs = cand[:keep], probs[:keep]
    if p.min_p > 0:
        cand = cand[probs >= p.min_p * probs[0]]
    return np.sort(cand)


def random_logits(g: np.random.Generator, v: int, kind: int) -> np.ndarray:
    z = (g.standard_normal(v) * g.uniform(0.3, 6)).astype(np.float32)
    if kind == 1:  # a handful of values: ties everywhere, at every cut
        z = g.integers(-3, 3, v).astype(np.float32)
    elif kind == 2:  # ties, signed zeros, -inf
        z = np.round(z * 2) / 2
        z[g.integers(0, v, 4)] = -0.0
        z[g.integers(0, v, 4)] = 0.0
        z[g.integers(0, v, 2)] = -np.inf
    elif kind == 3:  # flat with a few equal maxima
        z = np.full(v, 1.25, np.float32)
        z[g.integers(0, v, 3)] = 2.0
    return z


def random_knobs(g: np.random.Generator, v: int):
    return knobs(
        temperature=float(g.choice([1.0, 0.7, 2.5, 1e-3, 1e-6, 1e-30, g.uniform(0.05, 3)])),
        top_k=int(g.choice([0, 0, 1, 2, 7, 40, 64, v - 1, v, v + 5])),
        top_p=float(g.choice([1.0, 1.0, 0.95, 0.5, 0.05, g.uniform(0.01, 1)])),
        min_p=float(g.choice([0.0, 0.0, 0.05, 0.3, 1.0, g.uniform(0, 1)])),
    )


def test_sample_ref_is_the_chain_spelled_out():
    """Fresh random rows (ties, signed zeros, -inf, flat rows), knobs (top_k 0 / 1 / >= V,
    top_p 1, min_p 0 and 1, tiny temperatures) and u (0 and the largest below 1 included)."""
    g = np.random.default_rng()
    for trial in range(400):
        v = int(g.choice([1, 2, 5, 64, 300, 2000]))
        z, p = random_logits(g, v, trial % 4), random_knobs(g, v)
        u = [0.0, float(np.nextafter(1.0, 0.0)), float(g.random())][trial % 3]
        assert sample_ref(z, p, u) == naive(z, p, u), (trial, v, p, u)


def test_kept_set_is_the_float_chain_of_before():
    """Continuous logits: the fixed-point cuts keep what the float64 chain kept."""
    g = np.random.default_rng()
    for _ in range(300):
        v = int(g.choice([10, 500, 5000]))
        z = (g.standard_normal(v) * g.uniform(0.5, 5)).astype(np.float32)
        p = random_knobs(g, v)
        np.testing.assert_array_equal(kept_ref(z, p), old_kept(z, p), err_msg=str(p))


def test_draw_is_the_inverse_cdf_of_the_temperature_softmax():
    """Sweeping u over [0, 1): the ids come in vocabulary order, only kept ids come out, and
    each takes a share of u equal to its temperature-softmax probability over the kept."""
    g = np.random.default_rng()
    n = 5000
    us = (np.arange(n) + 0.5) / n
    for _ in range(3):
        z = (g.standard_normal(400) * 2).astype(np.float32)
        p = knobs(temperature=float(g.uniform(0.5, 2)), top_k=50, top_p=0.9, min_p=0.01)
        kept = kept_ref(z, p)
        toks = np.array([sample_ref(z, p, u) for u in us])
        assert np.all(np.diff(toks) >= 0) and set(toks) <= set(kept)
        zk = z[kept].astype(np.float64) / p.temperature
        want = np.exp(zk - zk.max()) / np.exp(zk - zk.max()).sum()
        got = np.array([(toks == i).mean() for i in kept])
        assert np.abs(got - want).max() <= 1.0 / n + 1e-9


def test_tiny_temperature_is_the_argmax_and_ties_share_u():
    z = np.array([0.5, 3.0, -1.0, 3.0, 2.999], np.float32)
    p = knobs(temperature=1e-6, top_k=0)
    assert {sample_ref(z, p, u) for u in (0.0, 0.25, 0.49)} == {1}
    assert {sample_ref(z, p, u) for u in (0.5, 0.75, 0.999)} == {3}
    assert sample_ref(z, knobs(temperature=0.0), 0.9) == 1  # greedy: the lower index


def test_signed_zeros_rank_as_equals():
    keys = order_keys(np.array([-0.0, 0.0, -1.0, 1.0, -np.inf], np.float32))
    assert keys[0] == keys[1] and keys[2] < keys[0] < keys[3] and keys[4] < keys[2]
    z = np.array([-0.0, 0.0, -5.0], np.float32)
    assert sample_ref(z, knobs(top_k=1), 0.99) == 0  # the tie goes to the lower index


def test_knob_values_refuse_u_outside_the_unit_interval():
    with pytest.raises(ValueError, match="u must be"):
        knob_values(knobs(), 1.0)
    assert knob_values(knobs(top_k=5), 0.5).tolist() == [5, 1.0, 0.0, 1.0, 0.5]


def test_sampler_draws_one_u_per_token_from_its_seed():
    g = np.random.default_rng()
    p = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.02, seed=int(g.integers(99)))
    rows = [(g.standard_normal(300) * 3).astype(np.float32) for _ in range(30)]
    us = np.random.default_rng(p.seed).random(len(rows))
    want = [sample_ref(r, p, float(u)) for r, u in zip(rows, us, strict=True)]
    s = Sampler(p)
    assert [s(r) for r in rows] == want
    assert len(set(want)) > 1  # the rows are random: the draws are not all one token
    greedy = Sampler(SamplingParams(seed=p.seed))
    assert [greedy(r) for r in rows[:3]] == [int(np.argmax(r)) for r in rows[:3]]
    assert greedy.draw() == us[0]  # greedy tokens drew no u


def test_engine_decode_sample_is_sample_ref_of_the_next_logits(synth_model):
    """decode_sample through the host tier == sample_ref(forward), step for step."""
    model = load_model(synth_model("tiny", "Q4_K", seed=43))
    a, b = Engine(model, n_ctx=48), Engine(model, n_ctx=48)
    g = np.random.default_rng()
    prompt = g.integers(0, model.args.n_vocab, 5).tolist()
    tok = int(np.argmax(a.forward(prompt)))
    b.forward(prompt)
    v = model.args.n_vocab
    for _ in range(12):
        p, u = random_knobs(g, v), float(g.random())
        nxt = a.decode_sample(tok, p, u)
        assert nxt == sample_ref(b.forward([tok]), p, u)
        tok = nxt
    assert a.pos == b.pos == 17 and a.stats.decode_steps == b.stats.decode_steps == 12


def test_seeded_session_samples_through_the_tier_as_the_logits_path_does(synth_model):
    """A seeded non-greedy generation: the session's decode_sample steps give the tokens that
    Sampler(logits) gives on the same engine, and every decode step sampled in the tier."""
    model = load_model(synth_model("tiny", "Q4_K", seed=44))
    p = SamplingParams(temperature=1.2, top_k=0, top_p=0.97, min_p=0.0, seed=2024)
    s = Session(model, n_ctx=128)
    calls = []
    sample = s.engine.tier.output_sample
    s.engine.tier.output_sample = lambda *a: calls.append(1) or sample(*a)
    res = Generation()
    list(s.generate([1, 2, 3, 4], 40, p, result=res))
    assert len(calls) == max(len(res.tokens) - (res.finish_reason == "length"), 0)

    eng, sampler = Engine(model, n_ctx=128), Sampler(p)
    logits, want = eng.forward([1, 2, 3, 4]), []
    for step in range(40):
        nxt = sampler(logits)
        if nxt in model.tokenizer.eos_ids:
            break
        want.append(nxt)
        if step + 1 < 40:
            logits = eng.forward([nxt])
    assert res.tokens == want and len(want) > 3
    eng.reset()
    greedy = [int(np.argmax(eng.forward([1, 2, 3, 4])))]
    for _ in range(len(want) - 1):
        greedy.append(eng.decode_greedy(greedy[-1]))
    assert greedy != want  # the test samples: its tokens are not the greedy ones
