"""pytest-benchmark gates for the CPU expert pool: one decode layer of a Qwen3-30B-A3B shape.

Each call routes the token to 8 experts from a fixed rotation of random picks over all 128, so
the weights come from DRAM (as in decode) and every run of the gate does the same work.

Run and compare against the stored baseline (bench/results/benchmarks/, see bench/README.md):

  python -m pytest bench/test_gates_cpu_pool.py --benchmark-storage=bench/results/benchmarks \\
      --benchmark-compare=0001 --benchmark-compare-fail=median:10%

(35% on the shared 2-vCPU dev VM, where unchanged code moves 15-30%: see bench/README.md.)

Save a new baseline on an idle machine of the same kind:

  python -m pytest bench/test_gates_cpu_pool.py --benchmark-storage=bench/results/benchmarks \\
      --benchmark-save=cpu_pool
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")

from strata.bench.cpu_pool import _routes, make_layer  # noqa: E402
from strata.cpu import ExpertPool  # noqa: E402
from strata.model.synth import SHAPES  # noqa: E402

SHAPE = "qwen3-30b-a3b"


def _decode_layer(benchmark, quant: str, tokens: int = 1):
    s = SHAPES[SHAPE]
    lw = make_layer(SHAPE, quant)
    pool = ExpertPool(numba.config.NUMBA_NUM_THREADS)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((tokens, s["n_embd"])).astype(np.float32)
    routes = [_routes(rng, tokens, s["n_expert"], s["n_expert_used"]) for _ in range(64)]
    pool.run_layer(x, *routes[0], lw)  # compile outside the timing
    it = iter(range(1 << 30))

    def step():
        return pool.run_layer(x, *routes[next(it) % len(routes)], lw)

    y = benchmark(step)
    assert np.isfinite(y).all()
    benchmark.extra_info["gguf_bytes_per_call"] = pool.last_gguf_bytes
    benchmark.extra_info["read_bytes_per_call"] = pool.last_bytes


@pytest.mark.parametrize("quant", ["IQ3_XXS", "Q4_K", "IQ1_M"])
def test_gate_cpu_pool_decode_layer(benchmark, quant):
    _decode_layer(benchmark, quant)


def test_gate_cpu_pool_batch8_layer(benchmark):
    _decode_layer(benchmark, "IQ3_XXS", tokens=8)
