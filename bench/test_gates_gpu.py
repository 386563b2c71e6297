"""pytest-benchmark gates for the GPU tier (marker `gpu`; skipped without CuPy and a device).

A Qwen3-30B-A3B-shaped decode layer (IQ3_XXS experts, Q8_0 attention, 4K context: the
gpu-kernels arm's layer) in its two halves, and a whole decode step of a synthetic model from
CUDA graphs, all resident and hybrid (the CPU pool between the graphs). Each round waits for
the card, so the times are wall times of the launches plus their device time.

Save a baseline on the GPU machine, then compare against it there (see bench/README.md):

  python -m pytest -m gpu bench/test_gates_gpu.py --benchmark-storage=bench/results/benchmarks \\
      --benchmark-save=gpu
  python -m pytest -m gpu bench/test_gates_gpu.py --benchmark-storage=bench/results/benchmarks \\
      --benchmark-compare=NNNN --benchmark-compare-fail=median:10%
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pytest_benchmark")
cp = pytest.importorskip("cupy")

from gguf.constants import GGMLQuantizationType  # noqa: E402

from strata.gpu.rawmod import kernels_for  # noqa: E402

QT = GGMLQuantizationType
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def layer(device):
    from strata.bench.gpu_kernels import _Layer

    return _Layer(cp, kernels_for(device), np.random.default_rng(0), QT.IQ3_XXS, QT.Q8_0, 4096)


def _synced(fn):
    def run():
        fn()
        cp.cuda.Device().synchronize()

    return run


def test_gate_gpu_attention_half(benchmark, layer):
    benchmark.pedantic(_synced(layer.attention_part), rounds=200, warmup_rounds=20)


def test_gate_gpu_experts_half(benchmark, layer):
    benchmark.pedantic(_synced(layer.moe_part), rounds=200, warmup_rounds=20)


@pytest.mark.parametrize("cache", ["all", "12"])
def test_gate_graph_decode_step(benchmark, device, tmp_path_factory, cache):
    """One greedy decode token of a 4-layer `small`-shaped model from CUDA graphs."""
    from strata.build import build_engine
    from strata.config import resolve
    from strata.model.loader import load_model
    from strata.model.synth import SynthSpec, make_args, write_synthetic

    path = tmp_path_factory.mktemp("gate") / "small.gguf"
    spec = SynthSpec(make_args("small", n_layer=4), expert_quant=QT.IQ3_XXS, skew=1.0)
    write_synthetic(path, spec, progress=False)
    model = load_model(path)
    flags = dict(device="gpu", n_ctx=1024, expert_cache=cache, adapt_swaps=0, threads=4)
    engine = build_engine(model, resolve(flags, env={}))
    tok = int(np.argmax(engine.forward(list(range(1, 17)))))
    state = {"tok": tok}

    def step():
        if engine.pos >= engine.n_ctx - 1:
            engine.reset(keep=16)
        state["tok"] = engine.decode_greedy(state["tok"])

    benchmark.pedantic(step, rounds=300, warmup_rounds=10)
    assert engine.stats.graph_steps >= 310
