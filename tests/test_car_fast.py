"""The engine's compiled CAR (strata/routing/car.py) gives car_plan's plan exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from strata.routing import route_topk
from strata.routing.car import CarKnobs, car_plan, car_plan_fast
from strata.routing.estimate import GOLDEN


def same(a, b) -> None:
    assert np.array_equal(a.ids, b.ids)
    assert np.array_equal(a.substituted, b.substituted)
    assert np.array_equal(a.ratios, b.ratios)
    assert a.misses == b.misses


def test_golden_cases():
    for c in json.loads(GOLDEN.read_text()):
        args = (np.array(c["ids"]), np.array(c["probs"], np.float32), np.array(c["resident"], bool))
        knobs = CarKnobs(**c["knobs"])
        got = car_plan_fast(*args, knobs)
        assert got.ids.tolist() == c["expect"], c["name"]
        same(got, car_plan(*args, knobs))


@pytest.mark.parametrize("seed", range(6))
def test_random_routing_with_ties_budgets_and_free_ratios(seed):
    g = np.random.default_rng(seed)
    for _ in range(150):
        e = int(g.choice([8, 16, 64, 128]))
        k = int(g.integers(1, min(8, e) + 1))
        t = int(g.integers(1, 4))
        logits = (g.standard_normal((t, e)) * g.uniform(0.2, 4)).astype(np.float32)
        if g.random() < 0.3:  # exact ties among candidates and between misses
            logits[:, : e // 2] = np.round(logits[:, : e // 2])
        ids, _, probs = route_topk(logits, k, True)
        resident = g.random(e) < g.uniform(0, 1)
        knobs = CarKnobs(
            threshold=float(g.choice([0.05, 0.25, 0.35, 0.7, 1.0, 1.5])),
            budget=int(g.integers(0, 3)),
            free_ratio=float(g.choice([0.5, 0.9, 1.0, 2.0])),
        )
        same(car_plan_fast(ids, probs, resident, knobs), car_plan(ids, probs, resident, knobs))
