"""CAR, traces, offline replay, profiles and placement, config precedence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strata.build import build_engine
from strata.config import CAR_OFF_NOTICE, ConfigError, resolve
from strata.engine.engine import Engine
from strata.model.loader import load_model
from strata.routing.car import CarKnobs, car_plan
from strata.routing.estimate import GOLDEN, check_golden, replay
from strata.routing.profile import AdaptiveCache, UsageProfile, place
from strata.routing.topk import route_topk


def test_golden_cases_hold():
    assert check_golden() == len(json.loads(GOLDEN.read_text())) >= 9


def test_a_wrong_rule_fails_the_golden_check(tmp_path):
    cases = json.loads(GOLDEN.read_text())
    cases[0]["expect"] = [[0, 4]]  # the worse substitute
    bad = tmp_path / "golden.json"
    bad.write_text(json.dumps(cases))
    with pytest.raises(AssertionError, match="golden case"):
        check_golden(bad)


def _random_routing(rng, t=6, e=32, k=4):
    logits = rng.standard_normal((t, e)).astype(np.float32) * 2
    ids, w, probs = route_topk(logits, k, True)
    resident = rng.random(e) < 0.4
    return ids, w, probs, resident


def test_car_invariants_on_random_routing():
    rng = np.random.default_rng()
    for _ in range(50):
        ids, _, probs, resident = _random_routing(rng)
        knobs = CarKnobs(threshold=0.3)
        plan = car_plan(ids, probs, resident, knobs)
        changed = plan.ids != ids
        assert (changed == plan.substituted).all()
        # only misses change, and only into resident experts the token had not picked
        assert not resident[ids][changed].any()
        assert resident[plan.ids[changed]].all()
        for row in range(ids.shape[0]):
            assert len(set(plan.ids[row])) == ids.shape[1]
            new = plan.ids[row][changed[row]]
            assert not np.isin(new, ids[row]).any()
        r = (
            probs[np.arange(ids.shape[0])[:, None], plan.ids]
            / probs[np.arange(ids.shape[0])[:, None], ids]
        )
        assert (r[changed] >= 0.3 - 1e-6).all()
        assert plan.misses == int((~resident[ids]).sum())
        # deterministic
        again = car_plan(ids, probs, resident, knobs)
        assert (again.ids == plan.ids).all()


def test_budget_and_free_ratio_bound_substitutions():
    rng = np.random.default_rng()
    for _ in range(30):
        ids, _, probs, resident = _random_routing(rng, k=6)
        free = car_plan(ids, probs, resident, CarKnobs(0.05, budget=1, free_ratio=0.6))
        for row in range(ids.shape[0]):
            counted = free.substituted[row] & (free.ratios[row] < 0.6)
            assert counted.sum() <= 1
        capped = car_plan(ids, probs, resident, CarKnobs(0.05, budget=1))
        assert (capped.substituted.sum(axis=1) <= 1).all()


def test_threshold_one_is_off():
    rng = np.random.default_rng()
    ids, _, probs, resident = _random_routing(rng)
    plan = car_plan(ids, probs, resident, CarKnobs(1.0))
    assert (plan.ids == ids).all() and not plan.substituted.any()


@pytest.mark.parametrize("bad", [dict(threshold=0), dict(warmup=-1), dict(free_ratio=0)])
def test_car_knobs_refuse_bad_values(bad):
    with pytest.raises(ValueError):
        CarKnobs(**bad)


def _greedy(engine, prompt, n):
    logits = engine.forward(prompt)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.forward([out[-1]])
    return out


def _partial_cache(model, slots):
    from strata.build import resident_mask

    return resident_mask(model, slots, None)


@pytest.mark.parametrize("mode", ["slack", "ratio"])
def test_threshold_one_is_byte_identical_to_car_not_wired(synth_model, mode):
    model = load_model(synth_model("tiny", "Q4_K", seed=21, n_expert=16))
    prompt = [5, 17, 300, 42]
    res = _partial_cache(model, 12)
    unwired = Engine(model, n_ctx=128, resident=res.copy())
    off = Engine(model, n_ctx=128, resident=res.copy(), car=CarKnobs(1.0, mode=mode))
    on = Engine(model, n_ctx=128, resident=res.copy(), car=CarKnobs(0.05, mode=mode))
    for e in (unwired, off, on):  # room for one job a window: slack mode keeps one miss
        e.stats.slack.assume(67.0, 50.0)
    a, b = _greedy(unwired, prompt, 64), _greedy(off, prompt, 64)
    assert a == b
    assert np.array_equal(unwired.forward([a[-1]]), off.forward([a[-1]]))  # the logits' bytes
    assert off.stats.substitutions == 0 and unwired.stats.misses > 0
    _greedy(on, prompt, 64)
    assert on.stats.substitutions > 0  # the same model with CAR on does substitute


def test_warmup_delays_car(synth_model):
    model = load_model(synth_model("tiny", "Q4_K", seed=21, n_expert=16))
    e = Engine(
        model, n_ctx=128, resident=_partial_cache(model, 12), car=CarKnobs(0.05, warmup=1000)
    )
    _greedy(e, [1, 2, 3], 16)
    assert e.stats.substitutions == 0 and e.stats.misses > 0


def test_trace_replay_gives_the_live_substitution_counts(synth_model, tmp_path):
    model = load_model(synth_model("tiny", "Q4_K", seed=22, n_expert=16))
    resident = _partial_cache(model, 12)
    knobs = CarKnobs(0.2, warmup=3, budget=1, free_ratio=0.7)
    trace = tmp_path / "scores.strcs"
    e = Engine(model, n_ctx=128, resident=resident.copy(), car=knobs, trace_path=str(trace))
    _greedy(e, [9, 8, 7, 6, 5], 40)
    e.close()
    est = replay(trace, resident, knobs)
    assert est.substitutions == e.stats.substitutions > 0
    assert est.misses == e.stats.decode_misses_before_car - _warm_misses(trace, resident, 3)
    assert est.rank_hist.sum() == est.substitutions
    assert est.rank_hist[: model.args.n_expert_used].sum() == 0  # substitutes rank below top-k


def test_trace_carries_the_slack_and_replays_the_slack_rule(synth_model, tmp_path):
    from strata.routing.trace import read_trace, record_slack

    model = load_model(synth_model("tiny", "Q4_K", seed=22, n_expert=16))
    resident = _partial_cache(model, 10)
    knobs = CarKnobs(0.2, mode="slack", max_weight=0.6)
    trace = tmp_path / "scores.strcs"
    e = Engine(model, n_ctx=128, resident=resident.copy(), car=knobs, trace_path=str(trace))
    e.stats.slack.assume(70.0, 50.0)  # 1.4 jobs of room: one miss a token kept
    _greedy(e, [9, 8, 7, 6, 5], 40)
    e.close()
    _, rec = read_trace(trace)
    dec = rec[(rec["flags"] & 1) == 1]
    assert np.allclose(record_slack(dec), 1.4)
    est = replay(trace, resident, knobs)
    assert est.substitutions == e.stats.substitutions > 0
    # the trace's slack field decides: no room replays more substitutions
    assert replay(trace, resident, knobs, slack=0.0).substitutions > est.substitutions


def test_car_estimate_replays_both_rules_with_the_traces_slack(tmp_path, capsys):
    from strata.cli.main import main
    from strata.routing.trace import TraceWriter

    g = np.random.default_rng(3)
    w = TraceWriter(tmp_path / "t.strcs", 2, 16, 4)
    for step in range(30):
        for layer in range(2):
            logits = g.standard_normal((1, 16)).astype(np.float32) * 2
            ids, _, probs = route_topk(logits, 4, True)
            w.write(step, layer, ids, probs, decode=True, slack=1.5)
    w.close()
    mask = tmp_path / "m.npy"
    np.save(mask, np.arange(32).reshape(2, 16) % 3 == 0)
    base = ["car-estimate", str(tmp_path / "t.strcs"), "--resident", str(mask), "--threshold"]
    rows = {}
    for extra in (["--mode", "ratio"], [], ["--slack", "0", "--max-weight", "1"]):
        assert main(base + ["0.35"] + extra) == 0
        rows[" ".join(extra)] = capsys.readouterr().out.splitlines()[-1].split()
    share = {k: int(v[2]) for k, v in rows.items()}  # substitutions
    assert share["--mode ratio"] == share["--slack 0 --max-weight 1"] > share[""] > 0
    assert main(base + ["0.35", "--max-weight", "0"]) == 2  # refused in one line


def test_a_trace_written_before_the_slack_field_still_replays(tmp_path):
    from strata.routing.trace import _HEADER, MAGIC, TraceHeader, read_trace, record_slack

    h = TraceHeader(1, 6, 2, flags=0)
    rec = np.zeros(2, h.record_dtype())
    rec["step"], rec["flags"] = [0, 1], 1
    rec["ids"] = [[0, 1], [0, 1]]
    rec["scores"] = [0.4, 0.2, 0.15, 0.1, 0.1, 0.05]
    old = tmp_path / "old.strcs"
    old.write_bytes(_HEADER.pack(MAGIC, 1, 6, 2, 0) + rec.tobytes())
    got_h, got = read_trace(old)
    assert got_h.flags == 0 and (record_slack(got) == 0).all()
    resident = np.array([[True, False, True, False, True, False]])
    est = replay(old, resident, CarKnobs(0.35, mode="ratio"))
    assert est.substitutions == 2


def _warm_misses(trace, resident, warmup):
    from strata.routing.trace import read_trace

    _, rec = read_trace(trace)
    dec = rec[(rec["flags"] & 1) == 1]
    warm = np.unique(dec["step"])[:warmup]
    w = dec[np.isin(dec["step"], warm)]
    return int(sum((~resident[r["layer"]][r["ids"]]).sum() for r in w))


def test_profile_round_trip_and_placement(tmp_path):
    rng = np.random.default_rng()
    counts = rng.integers(0, 100, size=(3, 8))
    p = UsageProfile(counts, "m", 123)
    p.save(tmp_path / "p.json")
    q = UsageProfile.load(tmp_path / "p.json", 3, 8)
    assert (q.counts == counts).all() and q.tokens == 123
    with pytest.raises(ValueError, match="layers"):
        UsageProfile.load(tmp_path / "p.json", 4, 8)
    mask = place(counts, 5)
    assert mask.sum() == 5
    assert counts[mask].min() >= counts[~mask].max()


def test_adaptive_cache_admits_hot_experts_within_the_swap_limit():
    resident = np.zeros((1, 8), bool)
    resident[0, :4] = True
    cache = AdaptiveCache(resident, max_swaps=2)
    for _ in range(20):
        cache.observe(0, np.array([[6, 7]]))
    assert resident[0, 6] and resident[0, 7] and resident.sum() == 4
    assert cache.swaps_total == 2
    cache.observe(0, np.array([[5, 4]]))
    assert cache.swaps_total == 2  # window exhausted
    static = AdaptiveCache(np.eye(1, 8, dtype=bool), max_swaps=0)
    static.observe(0, np.array([[3, 4]]))
    assert static.swaps_total == 0


def test_config_flag_beats_environment_beats_default():
    env = {"STRATA_CAR_THRESHOLD": "0.5", "STRATA_ADAPT_SWAPS": "7"}
    cfg = resolve({"car_threshold": 0.25}, env)
    assert cfg.car_threshold == 0.25 and cfg.adapt_swaps == 7
    assert resolve({}, {}).car_threshold == 0.35
    with pytest.raises(ConfigError, match="not a valid"):
        resolve({}, {"STRATA_CAR_WARMUP": "soon"})
    with pytest.raises(ConfigError, match="expert-cache"):
        resolve({"expert_cache": "lots"}, {})


def test_car_on_an_unwired_path_is_refused_if_asked_and_downgraded_if_default(synth_model):
    model = load_model(synth_model("tiny", "Q4_K"))
    cfg = resolve({}, {})
    e = build_engine(model, cfg)  # no GPU: every expert in the pool, CAR has nothing to use
    assert e.car.threshold == 1.0 and any(CAR_OFF_NOTICE in n for n in cfg.notices)
    with pytest.raises(ConfigError, match="cannot apply"):
        build_engine(model, resolve({"car_threshold": 0.5}, {}))
    partial = build_engine(model, resolve({"expert_cache": "6"}, {}))
    assert partial.car.threshold == 0.35 and partial.resident.sum() == 6
    full = build_engine(model, resolve({"expert_cache": "all"}, {}))  # no pool: CAR cannot act
    assert full.car.threshold == 1.0 and full.miss_runner is full.tier


@pytest.mark.parametrize("t", [1, 37])
def test_route_topk_breaks_ties_lower_id_first(t):
    """Top-K as a stable sort of -p would give it, ties inside the K and at its boundary too."""
    g = np.random.default_rng()
    e, k = 128, 8
    for _ in range(20):
        logits = g.standard_normal((t, e)).astype(np.float32)
        for r in range(t):  # equal logits: at the top, inside the K, and across the boundary
            order = np.argsort(-logits[r], kind="stable")
            a, b = g.choice(e, 2, replace=False)
            logits[r, [a, b]] = logits[r, order[0]]
            pos = g.integers(1, k + 3)
            logits[r, g.choice(e, 3, replace=False)] = logits[r, order[pos]]
        ids, w, probs = route_topk(logits, k, True)
        want = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        np.testing.assert_array_equal(ids, want)
        p = np.take_along_axis(probs, want, axis=-1)
        np.testing.assert_allclose(w, p / np.maximum(p.sum(-1, keepdims=True), 6.103515625e-5))
