"""The card's CAR (kernels/route_car.cu) is the host's rule: the golden cases (strata/routing/
car_golden.json, the file car_plan and car_plan_fast are held to) and random routing in both
modes, slack and weight bound included. Runs on a GPU, and on tools/gpu_emu
(tests/test_gpu_emulated.py)."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from strata.gpu.route_car import knob_values, route_car  # noqa: E402
from strata.routing.car import CarKnobs, car_plan  # noqa: E402
from strata.routing.estimate import golden_cases  # noqa: E402

pytestmark = pytest.mark.gpu


def run(K, logits: np.ndarray, k: int, resident: np.ndarray, kv: np.ndarray) -> dict:
    t, e = logits.shape
    out = {
        "probs": cp.zeros((t, e), np.float32),
        "ids0": cp.zeros((t, k), np.int32),
        "ids": cp.zeros((t, k), np.int32),
        "weights": cp.zeros((t, k), np.float32),
        "pair_slot": cp.zeros((t, k), np.int32),
        "stats": cp.zeros((t, 4), np.float32),
    }
    slot_row = np.where(resident, np.arange(e), -1).astype(np.int32)
    route_car(
        K, cp.asarray(logits), t, e, k, True, cp.asarray(slot_row), cp.asarray(kv), out
    )  # fmt: skip
    return {n: cp.asnumpy(v) for n, v in out.items()}


def kv_of(knobs: CarKnobs, slack: float) -> np.ndarray:
    keep, max_weight = knobs.bounds(slack)
    return knob_values(
        knobs.threshold, knobs.budget, knobs.free_ratio, knobs.enabled, max_weight, keep
    )


def test_route_car_gives_the_golden_plans(K):
    for c in golden_cases():
        logits = np.log(c["probs"]).astype(np.float32)  # the kernel's softmax gives them back
        k = c["ids"].shape[1]
        got = run(K, logits, k, c["resident"], kv_of(c["knobs"], c["slack"]))
        np.testing.assert_array_equal(got["ids0"], c["ids"], err_msg=c["name"])
        assert got["ids"].tolist() == c["expect"], c["name"]


@pytest.mark.parametrize("mode", ["slack", "ratio"])
def test_route_car_gives_car_plans_plan_with_slack(K, mode):
    g = np.random.default_rng()
    for trial in range(40):
        e = int(g.choice([8, 16, 64]))
        k = int(g.integers(1, 9))
        t = int(g.integers(1, 3))
        logits = (g.standard_normal((t, e)) * g.uniform(0.3, 3)).astype(np.float32)
        if g.random() < 0.3:  # ties among the picks and the candidates
            logits = np.round(logits)
        resident = g.random(e) < g.uniform(0.2, 0.9)
        knobs = CarKnobs(
            threshold=float(g.choice([0.1, 0.35, 0.7, 1.0])),
            budget=int(g.integers(0, 3)),
            free_ratio=float(g.choice([0.5, 1.0, 2.0])),
            mode=mode,
            max_weight=float(g.choice([0.1, 0.25, 0.5, 1.0])),
        )
        slack = float(g.choice([0.0, 0.5, 1.0, 2.3, 5.0]))
        got = run(K, logits, k, resident, kv_of(knobs, slack))
        plan = car_plan(got["ids0"], got["probs"], resident, knobs, slack)
        np.testing.assert_array_equal(got["ids"], plan.ids, err_msg=f"trial {trial}")
        st = got["stats"]
        assert st[:, 1].sum() == plan.substituted.sum()
        np.testing.assert_allclose(st[:, 3].sum(), plan.ratios.sum(), rtol=1e-6)
