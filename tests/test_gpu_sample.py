"""Sampling on the card (kernels/sample.cu) against `sample_ref`, and in the engine: eager, from
CUDA graphs, and against the host tier.

The kernel's sums are exact integers (fixed-point probabilities), so it must draw sample_ref's
token for every row, knobs and u: the only way the two could part is the device's exp landing an
ulp from libm's and moving a fixed-point value across a cut (about 1e-12 of the mass). Against
the host tier the logits themselves differ (~1e-5 relative, tests/test_gpu_tier.py), which
moves a draw only where u or a cut sits within that of a boundary: a rare step.
"""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from strata.cpu.sampling import kept_ref, sample_ref  # noqa: E402
from strata.engine.engine import Engine  # noqa: E402
from strata.engine.sampling import SamplingParams  # noqa: E402
from strata.gpu.cupy_tier import CupyTier  # noqa: E402
from strata.gpu.decode_graph import Pinned  # noqa: E402
from strata.gpu.rawmod import Kernels  # noqa: E402
from strata.gpu.sample import N_KNOBS, SampleBufs, knob_values, sample_logits, sample_row  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from tests.test_gpu_graph import engine  # noqa: E402
from tests.test_gpu_tier import record_routing, routes, small_budget  # noqa: E402
from tests.test_sampling_device import random_knobs, random_logits  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def K(device):
    return Kernels(cp, device.warp_size, device.sm_count)


def fresh_case(g: np.random.Generator, v: int, trial: int):
    z, p = random_logits(g, v, trial % 4), random_knobs(g, v)
    if trial % 5 == 4:
        p.top_k = int(g.integers(1, v + 1))  # any k, not only the usual ones
    u = [0.0, float(np.nextafter(1.0, 0.0)), float(g.random())][min(trial % 7, 2)]
    return z, p, u


@pytest.mark.parametrize("v", [151936, 1000, 7])
def test_kernel_draws_sample_refs_token(K, v):
    """Fresh random rows (ties, signed zeros, -inf, flat), knobs (top_k 0 / 1 / any / >= V,
    top_p 1, min_p 0 and 1, tiny temperatures, greedy) and u: the card's token == sample_ref's."""
    g = np.random.default_rng()
    bufs = SampleBufs(cp, v)
    bad = []
    for trial in range(60 if v > 10000 else 300):
        z, p, u = fresh_case(g, v, trial)
        got = sample_logits(K, cp.asarray(z), v, bufs, p, u)
        want = sample_ref(z, p, u)
        if got != want:
            bad.append((trial, vars(p), u, got, want))
    assert not bad, f"{len(bad)} rows differ, first: {bad[:3]}"


def test_kernel_in_a_graph_reads_the_knobs_written_before_each_replay(K):
    """Captured once (knobs up from pinned memory, the id down), replayed with new logits,
    knobs and u: each replay draws sample_ref's token."""
    v = 151936
    g = np.random.default_rng()
    bufs, zd = SampleBufs(cp, v), cp.zeros((v,), np.float32)
    knobs_h, tok_h = Pinned(cp, (N_KNOBS,), np.float64), Pinned(cp, (1,), np.int32)
    stream = cp.cuda.Stream(non_blocking=True)
    rt = cp.cuda.runtime

    def launch() -> None:
        rt.memcpyAsync(
            bufs.knobs.data.ptr, knobs_h.a.ctypes.data, knobs_h.a.nbytes,
            rt.memcpyHostToDevice, stream.ptr,
        )  # fmt: skip
        sample_row(K, zd, v, bufs)
        rt.memcpyAsync(tok_h.a.ctypes.data, bufs.tok.data.ptr, 4, rt.memcpyDeviceToHost, stream.ptr)

    knobs_h.a[:] = knob_values(SamplingParams(temperature=1.0), 0.5)
    with stream:
        launch()  # compiles the module outside the capture
        stream.synchronize()
        stream.begin_capture()
        launch()
        graph = stream.end_capture()
    for trial in range(24):
        z, p, u = fresh_case(g, v, trial)
        zd.set(z)
        knobs_h.a[:] = knob_values(p, u)
        graph.launch(stream)
        stream.synchronize()
        assert int(tok_h.a[0]) == sample_ref(z, p, u), (trial, vars(p), u)


@pytest.mark.parametrize("cache", ["all", "7"])
def test_decode_sample_from_graphs_is_sample_ref_of_the_step_logits(synth_model, device, cache):
    """decode_sample in graph steps (all resident; routed hybrid) == sample_ref of the same
    step's logits from a twin engine, with knobs and u changing every step."""
    model = load_model(synth_model("tiny", "Q4_K", seed=26, skew=1.0))
    a, b = engine(model, True, expert_cache=cache), engine(model, True, expert_cache=cache)
    g = np.random.default_rng()
    v = model.args.n_vocab
    prompt = g.integers(0, v, 5).tolist()
    la, lb = a.forward(prompt), b.forward(prompt)
    assert np.array_equal(la, lb)
    tok = sample_ref(lb, random_knobs(g, v), float(g.random()))
    for step in range(24):
        p, u = random_knobs(g, v), float(g.random())
        nxt = a.decode_sample(tok, p, u)
        assert nxt == sample_ref(b.forward([tok]), p, u), (step, vars(p), u)
        tok = nxt
    assert a.stats.graph_steps == b.stats.graph_steps == 24
    assert a.pos == b.pos == 5 + 24


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=1.1, top_k=0, top_p=0.9, min_p=0.0),
    ],
)
def test_eager_gpu_sampling_draws_the_host_tiers_tokens(synth_model, device, params):
    """GPU tier (eager launches, the draw on the card) vs host tier, both fed the host's tokens
    with one u per step: the card draws sample_ref's token of its own logits (a twin engine's)
    every step, and the host tier's token except where the logits' difference explains it: the
    routers parted on a near-tie, the two kept sets differ in that token (a cut at the top-p or
    min-p boundary), or u lies within the CDF shift the difference allows (the tempered
    softmaxes differ by at most 2 max|dz| / T in total variation) of the host's boundary."""
    model = load_model(synth_model("tiny", "Q4_K", dense="Q8_0", seed=7))
    args = model.args
    g = np.random.default_rng()
    host = Engine(model, n_ctx=128)
    dev, twin = (
        Engine(model, tier=CupyTier(model, 128, small_budget(), device=device), graphs=False)
        for _ in range(2)
    )
    hlog, dlog = record_routing(host.tier), record_routing(dev.tier)
    prompt = g.integers(0, args.n_vocab, 6).tolist()
    hl = host.forward(prompt)
    dev.forward(prompt)
    twin.forward(prompt)
    tok = sample_ref(hl, params, float(g.random()))
    differ = 0
    for step in range(32):
        u = float(g.random())
        hl = host.forward([tok])
        tl = twin.forward([tok])
        h = sample_ref(hl, params, u)
        d = dev.decode_sample(tok, params, u)
        assert d == sample_ref(tl, params, u), (step, u)
        if h != d:
            differ += 1
            apart = bool((routes(hlog, args) != routes(dlog, args)).any())
            cut = d in set(kept_ref(hl, params).tolist()) ^ set(kept_ref(tl, params).tolist())
            b = 4 * float(np.abs(hl - tl).max()) / params.temperature + 1e-6
            near = d in {sample_ref(hl, params, float(v)) for v in np.linspace(u - b, u + b, 257)
                         if 0 <= v < 1}  # fmt: skip
            assert apart or cut or near, (step, u, h, d, b)
        tok = h
    assert differ < 32
