"""Decode steps replayed from CUDA graphs give the eager launches' bits.

The hybrid graph steps run the eager path's kernels in its order (strata/gpu/decode_graph.py)
on the host's routing, so their logits must be bit-identical to eager decode, step after step
(the graphs are captured once and replayed with the position read from device memory): with
and without cache-aware routing, and for an all-resident model traced (the host routes, so the
hybrid shape runs). The all-resident step routes on the card (router_topk: the same ids, the
weights to ~1e-7), so it is held to float noise and the flip bound instead.
"""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from strata.config import resolve  # noqa: E402
from strata.engine.builder import build_engine  # noqa: E402
from strata.gpu.device import primary_device  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from tests.oracle import position_errors  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def device():
    try:
        info = primary_device()
    except Exception as e:
        pytest.skip(f"no usable GPU: {e}")
    if info is None:
        pytest.skip("no GPU")
    return info


def engine(model, graphs: bool, **flags):
    base = dict(device="gpu", n_ctx=96, adapt_swaps=0, threads=2, cuda_graphs=graphs)
    base.update(flags)
    return build_engine(model, resolve(base, env={}))


def lockstep(a, b, prompt: list[int], steps: int, exact: bool = True) -> np.ndarray:
    """Feed both engines b's greedy tokens; with `exact` the logits must be equal at every
    step. Returns the per-step errors (max |a - b| / max |b|)."""
    la, lb = a.forward(prompt), b.forward(prompt)
    assert np.array_equal(la, lb)  # prefill is eager on both
    errs = []
    for step in range(steps):
        tok = int(np.argmax(lb))
        la, lb = a.forward([tok]), b.forward([tok])
        errs.append(position_errors(la[None], lb[None])[0])
        assert not exact or np.array_equal(la, lb), f"step {step}: off by {errs[-1]:.3g}"
    return np.array(errs)


@pytest.mark.parametrize(
    "arch,quant", [("qwen3moe", "IQ3_XXS"), ("qwen3moe", "Q4_K"), ("qwen2moe", "Q4_K")]
)
def test_all_resident_graph_steps_equal_their_eager_launches(synth_model, device, arch, quant):
    """Replayed graphs == the same step's launches run eagerly, bit for bit; and the step,
    which routes on the card, decodes what the host-routed eager path decodes."""
    model = load_model(synth_model("tiny", quant, arch=arch, seed=21))
    g, e = engine(model, True, expert_cache="all"), engine(model, True, expert_cache="all")
    e.tier.graph_decoder().replay = False
    prompt = np.random.default_rng().integers(0, model.args.n_vocab, 5).tolist()
    lockstep(g, e, prompt, 40)
    assert g.stats.graph_steps == e.stats.graph_steps == 40 and len(g.tier.graph_decoder().graphs)
    assert not e.tier.graph_decoder().graphs
    assert np.array_equal(g.stats.expert_hist, e.stats.expert_hist)
    # router_topk's weights match route_topk's to ~1e-7, not bit for bit: against the host's
    # routing the logits agree to float noise until a Q8 rounding flips or a router near-tie
    # picks another expert, so only the greedy tokens are held (to most steps)
    h = engine(model, False, expert_cache="all")
    g.reset()
    la, lb = g.forward(prompt), h.forward(prompt)
    same = 0
    for _ in range(40):
        same += int(np.argmax(la)) == int(np.argmax(lb))
        tok = int(np.argmax(lb))
        la, lb = g.forward([tok]), h.forward([tok])
    assert same >= 32, f"greedy tokens agree at only {same} of 40 steps"


@pytest.mark.parametrize("car", [1.0, 0.35])
@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
def test_hybrid_graph_steps_equal_eager(synth_model, device, arch, car):
    model = load_model(synth_model("tiny", "IQ3_XXS", arch=arch, seed=22, skew=1.0))
    flags = dict(expert_cache="7", car_threshold=car)  # 7 of 16 experts on the card
    g, e = engine(model, True, **flags), engine(model, False, **flags)
    assert 0 < g.resident.sum() < g.resident.size
    prompt = np.random.default_rng().integers(0, model.args.n_vocab, 6).tolist()
    lockstep(g, e, prompt, 32)
    assert g.stats.graph_steps == 32
    assert g.stats.misses == e.stats.misses > 0 and g.stats.hits == e.stats.hits > 0
    assert g.stats.substitutions == e.stats.substitutions
    if car < 1.0:
        assert g.stats.substitutions > 0
    w = g.stats.window_ms()
    assert g.stats.window_layers == 32 * model.args.n_layer
    assert 0 < w["pool"] < w["window"] and 0 < w["wait"] < w["window"]


def test_traced_all_resident_model_runs_the_hybrid_shape(synth_model, device, tmp_path):
    model = load_model(synth_model("tiny", "Q4_K", seed=23))
    g = engine(model, True, expert_cache="all", dump_router_scores=str(tmp_path / "t.strcs"))
    e = engine(model, False, expert_cache="all")
    prompt = np.random.default_rng().integers(0, model.args.n_vocab, 4).tolist()
    lockstep(g, e, prompt, 12)
    assert g.stats.window_layers == 12 * model.args.n_layer  # routed on the host per layer
    g.close()


def test_adaptive_swaps_upload_off_the_critical_path(synth_model, device):
    """Admitted experts upload on the copy stream while the pool computes them this step; from
    the next step on they are hits. Graph and eager steps must still agree bit for bit."""
    model = load_model(synth_model("tiny", "Q4_K", seed=24, skew=2.0))
    flags = dict(expert_cache="6", adapt_swaps=40)
    g, e = engine(model, True, **flags), engine(model, False, **flags)
    up0 = g.tier.expert_uploads
    prompt = np.random.default_rng().integers(0, model.args.n_vocab, 6).tolist()
    lockstep(g, e, prompt, 40)
    assert g.stats.swaps == e.stats.swaps > 0
    assert g.tier.expert_uploads - up0 == g.stats.swaps  # one upload per admitted expert
    assert np.array_equal(g.resident, g.tier.slot_of >= 0)  # the tier holds what routing thinks
