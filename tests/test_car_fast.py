"""The engine's compiled CAR (strata/routing/car.py) gives car_plan's plan exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strata.routing import route_topk
from strata.routing.car import CarKnobs, car_plan, car_plan_fast
from strata.routing.estimate import GOLDEN, check_golden, golden_cases


def same(a, b) -> None:
    assert np.array_equal(a.ids, b.ids)
    assert np.array_equal(a.substituted, b.substituted)
    assert np.array_equal(a.ratios, b.ratios)
    assert a.misses == b.misses


def test_golden_cases():
    for c in golden_cases():
        args = (c["ids"], c["probs"], c["resident"], c["knobs"], c["slack"])
        got = car_plan_fast(*args)
        assert got.ids.tolist() == c["expect"], c["name"]
        same(got, car_plan(*args))
    assert check_golden() == len(json.loads(GOLDEN.read_text()))


def random_case(g):
    e = int(g.choice([8, 16, 64, 128]))
    k = int(g.integers(1, min(8, e) + 1))
    t = int(g.integers(1, 4))
    logits = (g.standard_normal((t, e)) * g.uniform(0.2, 4)).astype(np.float32)
    if g.random() < 0.3:  # exact ties among candidates and between misses
        logits[:, : e // 2] = np.round(logits[:, : e // 2])
    ids, _, probs = route_topk(logits, k, True)
    resident = g.random(e) < g.uniform(0, 1)
    return ids, probs, resident


@pytest.mark.parametrize("seed", range(6))
def test_random_routing_with_ties_budgets_and_free_ratios(seed):
    g = np.random.default_rng(seed)
    for _ in range(150):
        ids, probs, resident = random_case(g)
        knobs = CarKnobs(
            threshold=float(g.choice([0.05, 0.25, 0.35, 0.7, 1.0, 1.5])),
            budget=int(g.integers(0, 3)),
            free_ratio=float(g.choice([0.5, 0.9, 1.0, 2.0])),
            mode=str(g.choice(["slack", "ratio"])),
            max_weight=float(g.choice([0.05, 0.2, 0.25, 0.5, 1.0])),
        )
        slack = float(g.choice([0.0, 0.7, 1.0, 1.5, 3.0, 9.0]))
        same(
            car_plan_fast(ids, probs, resident, knobs, slack),
            car_plan(ids, probs, resident, knobs, slack),
        )


@pytest.mark.parametrize("seed", range(3))
def test_slack_mode_keeps_what_the_pool_hides_and_degrades_to_the_ratio_rule(seed):
    g = np.random.default_rng(100 + seed)
    for _ in range(200):
        ids, probs, resident = random_case(g)
        t, k = ids.shape
        th = float(g.choice([0.05, 0.35, 0.7]))
        ratio = car_plan(ids, probs, resident, CarKnobs(th, mode="ratio"))
        # no slack and no weight bound: the seeds' rule exactly
        same(car_plan(ids, probs, resident, CarKnobs(th, mode="slack", max_weight=1.0)), ratio)
        # room for every pick: nothing substituted
        full = car_plan(ids, probs, resident, CarKnobs(th, max_weight=1.0), float(k))
        assert not full.substituted.any()
        # room for some: the substituted picks are the lightest misses of their token, never
        # more than misses - keep, and never above the weight bound
        keep, mw = int(g.integers(0, k + 1)), float(g.choice([0.1, 0.3, 1.0]))
        plan = car_plan(ids, probs, resident, CarKnobs(th, max_weight=mw), keep + 0.5)
        pe = probs[np.arange(t)[:, None], ids].astype(np.float64)  # [T, K]
        w = pe / pe.sum(axis=1, keepdims=True)
        assert (w[plan.substituted] <= mw).all()
        for row in range(t):
            miss = ~resident[ids[row]]
            assert plan.substituted[row].sum() <= max(0, miss.sum() - keep)
            kept = miss & ~plan.substituted[row]
            if plan.substituted[row].any() and kept.sum() >= keep:
                heaviest_kept = np.sort(pe[row][kept])[::-1][:keep]
                assert (pe[row][plan.substituted[row]][:, None] <= heaviest_kept[None]).all()


def test_slack_meter_measures_the_window_the_pool_may_fill():
    """Decode steps where the card's cycle from one plan to the next is 100 us: 70 of resident
    experts the pool overlaps, 30 after the pool's sum joins; the pool takes 20 us a missed
    expert. 70 us of window: 3.5 jobs of room."""
    from strata.routing.slack import SlackMeter

    m = SlackMeter(4)
    assert m.jobs(1) == 0.0  # nothing measured: no room
    g = np.random.default_rng(0)
    route = 2e-6
    for _ in range(400):
        busy = 0.0  # the host's route + pool of the layer before
        for layer in range(4):
            jobs = int(g.integers(0, 6))
            pool = 20e-6 * jobs
            # the next plan comes max(window, route + pool) + 30 us after the last one
            wait = max(70e-6, busy) + 30e-6 - busy if layer else 500e-6  # layer 0: logits
            m.observe(layer, wait, route, pool, jobs)
            busy = route + pool
    for layer in range(3):  # the last layer's cycle ends in the next step: not measured
        assert m.jobs(layer) == pytest.approx(3.5, rel=0.05)
    assert m.summary()["job_us"] == pytest.approx(20.0)
    m.assume(67.0, 30.0)  # figures measured elsewhere: fixed
    m.observe(1, 1.0, 0.0, 1.0, 1)
    assert m.jobs(3) == pytest.approx(67 / 30)


def test_slack_meter_probes_a_layer_whose_pool_is_not_timed():
    """Windows observed with no job run (a rule that substituted every miss): the layer gets room
    for one job, so the next miss reaches the pool and is timed; then the measured figure."""
    from strata.routing.slack import PROBE, SlackMeter

    m = SlackMeter(2)
    for _ in range(3):  # every miss substituted: no pool time anywhere
        m.observe(0, 100e-6, 2e-6, 0.0, 0)
        m.observe(1, 90e-6, 2e-6, 0.0, 0)
    assert m.jobs(0) == m.jobs(1) == PROBE
    for _ in range(200):  # the kept miss runs: 20 us a job on layer 0, layer 1 idle
        m.observe(0, 80e-6, 2e-6, 20e-6, 1)
        m.observe(1, 90e-6, 2e-6, 0.0, 0)
    assert m.jobs(0) != PROBE and m.summary()["job_us"] == pytest.approx(20.0)


def test_the_cards_layer_knobs_are_the_rules_bounds():
    from strata.gpu.route_car import layer_knobs
    from strata.routing.slack import SlackMeter

    m = SlackMeter(3)
    m.slack[:, 0] = [0.4, 1.0, 2.7]
    for car in (CarKnobs(0.35), CarKnobs(0.35, mode="ratio"), CarKnobs(0.5, warmup=9)):
        kv = layer_knobs(car, 4, m, 3)
        for i in range(3):
            keep, mw = car.bounds(m.jobs(i))
            assert kv[i].tolist() == [car.threshold, car.budget, car.free_ratio,
                                      float(car.warmup <= 4), mw, keep]  # fmt: skip
    assert layer_knobs(None, 0, m, 3)[:, 3].tolist() == [0.0] * 3
