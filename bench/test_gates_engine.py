"""pytest-benchmark gates: routing plan time per layer and the host-tier decode step.

Run and compare against the stored baseline (see bench/README.md):
  python -m pytest bench/test_gates_engine.py --benchmark-storage=bench/results/benchmarks \
      --benchmark-compare --benchmark-compare-fail=median:10%
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.routing.car import CarKnobs, car_plan
from strata.routing.topk import route_topk

pytest.importorskip("pytest_benchmark")


@pytest.fixture(scope="module")
def qwen3_router_row():
    """One decode token of a Qwen3-30B-A3B-shaped layer: E=128, K=8, half the experts resident."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((1, 128)) * 2).astype(np.float32)
    resident = np.zeros(128, bool)
    resident[rng.permutation(128)[:64]] = True
    return logits, resident


def test_gate_route_topk_one_layer(benchmark, qwen3_router_row):
    logits, _ = qwen3_router_row
    ids, _, _ = benchmark(route_topk, logits, 8, True)
    assert ids.shape == (1, 8)


def test_gate_car_plan_one_layer(benchmark, qwen3_router_row):
    logits, resident = qwen3_router_row
    ids, _, probs = route_topk(logits, 8, True)
    plan = benchmark(car_plan, ids, probs, resident, CarKnobs(0.35))
    assert plan.ids.shape == (1, 8)


def test_gate_host_decode_step(benchmark):
    from strata.bench.common import EMBEDDED_MODEL
    from strata.engine.engine import Engine
    from strata.model.loader import load_model

    engine = Engine(load_model(EMBEDDED_MODEL), n_ctx=512)
    engine.forward([1, 2, 3, 4])

    def step():
        engine.reset(keep=4)  # the same work every round: one token after a 4-token prompt
        return engine.forward([5])

    logits = benchmark.pedantic(step, rounds=60, warmup_rounds=5)
    assert np.isfinite(logits).all()
