"""The int8 KV cache on the card against its NumPy references, and CupyTier against HostTier.

Append (qk_norm_rope_kv_i8): q is the f16 kernel's q bit for bit; V rows and their scales are
quantize_kv_rows' bit for bit (same float32 operations: absmax, / 127, x / d, rint); K rows come
from rotated values whose cos/sin may differ from libm's by an ulp, so a K quant may sit one step
off where x / d lands within float noise of a .5 (and a scale an ulp off). Attention over an int8
cache (prefill `attention`, decode `attention_decode`, its graph replay) is held to the f16 tests'
bound around attention_int8_ref (the f16 reference over the dequantized rows): 1e-5 of the
output's scale (the card applies a row's scale once, to the dot product or to the probability,
instead of per element: rounding-level) plus one f16 step where a probability sits at a rounding
midpoint. Whole model: test_gpu_tier's lockstep statement, both tiers with int8 caches (a K or V
quant one step apart moves the logits by up to ~1e-2 on the synthetic models, as much as f16 vs
int8 does: so the tiers' rows themselves are compared too, in layer 0 where both sides see the
same input), and graph decode over an int8 cache equal to its eager launches bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from strata.cpu.kv import dequantize_kv_rows, quantize_kv_rows  # noqa: E402
from strata.cpu.tier import HostTier, rope_inv_freq  # noqa: E402
from strata.engine.engine import Engine  # noqa: E402
from strata.gpu.attention import (  # noqa: E402
    DEC_SHORT_GRID,
    DEC_SHORT_MAX,
    AttnWorkspace,
    attention,
    attention_decode,
    attention_int8_ref,
)
from strata.gpu.cupy_tier import CupyTier  # noqa: E402
from strata.gpu.rope_kv import qk_norm_rope_kv, qk_norm_rope_kv_ref  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from tests.oracle import FLIP_BOUND  # noqa: E402
from tests.test_gpu_kernels import flip_allowance  # noqa: E402
from tests.test_gpu_tier import greedy_lockstep, small_budget  # noqa: E402

pytestmark = pytest.mark.gpu
S_CAP = 4352


def int8_cache(rows: np.ndarray, s_cap: int):
    """rows [S, G, D] float32 -> device (q [G, s_cap, D] int8, d [G, s_cap] float32), and the
    host (q8 [S, G, D], d [S, G])."""
    q8, d = quantize_kv_rows(rows)
    s, g, dim = rows.shape
    qc = np.zeros((g, s_cap, dim), np.int8)
    dc = np.zeros((g, s_cap), np.float32)
    qc[:, :s] = q8.transpose(1, 0, 2)
    dc[:, :s] = d.T
    return cp.asarray(qc), cp.asarray(dc), q8, d


def check(out, q, k8, kd, v8, vd, pos0: int, scale: float) -> None:
    t = q.shape[0]
    want = attention_int8_ref(q, k8, kd, v8, vd, pos0, scale)
    kf, vf = dequantize_kv_rows(k8, kd), dequantize_kv_rows(v8, vd)
    err = np.abs(cp.asnumpy(out)[:t] - want)
    bound = 1e-5 * np.abs(want).max() + flip_allowance(q, kf, vf, pos0, scale)
    assert np.all(err <= bound), f"S={pos0 + t}: max excess {float((err - bound).max()):.3g}"


# ---- append ----
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("dh,t,pos0", [(128, 3, 1000), (64, 1, 0), (80, 2, 511)])
def test_rope_kv_int8_append_matches_reference(K, qk_norm, dh, t, pos0):
    """Dh = 80: threads past Dh (96 launched at warp 32) take part in the row's absmax."""
    g = np.random.default_rng()
    h, gk, dv, s_cap = 8, 2, dh, 1024
    qkv = g.standard_normal((t, (h + gk) * dh + gk * dv)).astype(np.float32)
    qkv[:, -dv // 2] *= 30.0  # an outlier in some v rows: their step is coarse
    qn = (1 + 0.1 * g.standard_normal(dh)).astype(np.float32) if qk_norm else None
    kn = (1 + 0.1 * g.standard_normal(dh)).astype(np.float32) if qk_norm else None
    inv = rope_inv_freq(dh, 1e6)
    dev = [cp.asarray(a) if a is not None else None for a in (qkv, qn, kn, inv)]
    args = (K, dev[0], t, (h, gk, dh, dv), dev[1], dev[2], 1e-6, dev[3], pos0)
    q16 = cp.empty((t, h, dh), np.float32)
    qk_norm_rope_kv(*args, q16, cp.zeros((gk, s_cap, dh), np.uint16),
                    cp.zeros((gk, s_cap, dv), np.uint16))  # fmt: skip
    q8 = cp.empty((t, h, dh), np.float32)
    kc, vc = cp.zeros((gk, s_cap, dh), np.int8), cp.zeros((gk, s_cap, dv), np.int8)
    ks, vs = cp.zeros((gk, s_cap), np.float32), cp.zeros((gk, s_cap), np.float32)
    qk_norm_rope_kv(*args, q8, kc, vc, k_scale=ks, v_scale=vs)
    np.testing.assert_array_equal(cp.asnumpy(q8).view(np.uint32), cp.asnumpy(q16).view(np.uint32))
    _, (k_ref, kd_ref), (v_ref, vd_ref) = qk_norm_rope_kv_ref(
        qkv, (h, gk, dh, dv), qn, kn, 1e-6, inv, pos0, kv_type="int8"
    )
    rows = slice(pos0, pos0 + t)
    v, vd = cp.asnumpy(vc)[:, rows].transpose(1, 0, 2), cp.asnumpy(vs)[:, rows].T
    np.testing.assert_array_equal(v, v_ref)
    np.testing.assert_array_equal(vd, vd_ref)
    k, kd = cp.asnumpy(kc)[:, rows].transpose(1, 0, 2), cp.asnumpy(ks)[:, rows].T
    assert np.abs(kd / kd_ref - 1).max() < 1e-5
    assert np.abs(k.astype(np.int32) - k_ref).max() <= 1
    assert np.mean(k == k_ref) > 0.99
    assert (np.abs(k).max(-1) == 127).all()
    for c, sc in ((kc, ks), (vc, vs)):  # nothing else written
        c, sc = cp.asnumpy(c), cp.asnumpy(sc)
        assert not c[:, :pos0].any() and not c[:, pos0 + t :].any()
        assert not sc[:, :pos0].any() and not sc[:, pos0 + t :].any()


def test_rope_kv_int8_device_position_replays_in_a_graph(K):
    g = np.random.default_rng()
    h, gk, dh, s_cap = 4, 2, 64, 512
    qkv = cp.asarray(g.standard_normal((1, (h + 2 * gk) * dh)).astype(np.float32))
    inv = cp.asarray(rope_inv_freq(dh, 1e4))
    bufs = [
        (cp.empty((1, h, dh), np.float32), cp.zeros((gk, s_cap, dh), np.int8),
         cp.zeros((gk, s_cap, dh), np.int8), cp.zeros((gk, s_cap), np.float32),
         cp.zeros((gk, s_cap), np.float32))
        for _ in range(2)
    ]  # fmt: skip
    pos = cp.zeros(1, np.int32)
    args = (K, qkv, 1, (h, gk, dh, dh), None, None, 1e-6, inv)

    def launch(b, p, pos_dev=None):
        qk_norm_rope_kv(*args, p, b[0], b[1], b[2], pos_dev=pos_dev, k_scale=b[3], v_scale=b[4])

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        launch(bufs[0], 0, pos)  # compile first; row 0 on both sides
        launch(bufs[1], 0)
        stream.synchronize()
        stream.begin_capture()
        launch(bufs[0], 0, pos)
        graph = stream.end_capture()
        for p in (7, 300):
            pos.set(np.array([p], np.int32), stream=stream)
            graph.launch(stream)
            launch(bufs[1], p)
            stream.synchronize()
    for a, b in zip(*bufs, strict=True):  # rows 0, 7 and 300 of the caches and scales
        np.testing.assert_array_equal(cp.asnumpy(a), cp.asnumpy(b))
    assert cp.asnumpy(bufs[0][3])[:, [0, 7, 300]].all()


# ---- attention: prefill / multi-token ----
@pytest.mark.parametrize(
    "t,pos0,h,gk,dh",
    [(1, 0, 4, 2, 64), (1, 700, 8, 2, 128), (5, 300, 32, 4, 128), (9, 0, 4, 4, 64),
     (7, 1000, 8, 2, 80)],
)  # fmt: skip
def test_attention_int8_matches_reference(K, t, pos0, h, gk, dh):
    g = np.random.default_rng()
    s_cap, s = 1024, pos0 + t
    q = g.standard_normal((t, h, dh)).astype(np.float16).astype(np.float32)
    kc, ks, k8, kd = int8_cache(g.standard_normal((s, gk, dh)).astype(np.float32), s_cap)
    vc, vs, v8, vd = int8_cache(g.standard_normal((s, gk, dh)).astype(np.float32), s_cap)
    ws = AttnWorkspace(cp, K, h, gk, s_cap, dh, 16)
    out = cp.empty((16, h * dh), np.float32)
    scale = float(np.float32(1.0 / np.sqrt(dh)))
    attention(K, ws, cp.asarray(q), kc, vc, t, pos0, (h, gk, dh, dh), scale, out, ks, vs)
    check(out, q, k8, kd, v8, vd, pos0, scale)


def test_attention_refuses_an_int8_cache_without_scales(K):
    ws = AttnWorkspace(cp, K, 4, 2, 64, 64, 1)
    kc = cp.zeros((2, 64, 64), np.int8)
    with pytest.raises(ValueError, match="k_scale"):
        attention(K, ws, cp.zeros((1, 4, 64), np.float32), kc, kc, 1, 0, (4, 2, 64, 64), 0.125,
                  cp.empty((1, 256), np.float32))  # fmt: skip


# ---- attention: decode (the CUDA-graph form) ----
SIZES = [1, 63, 64, 65, 4096 + 17, S_CAP - 3, S_CAP]
SHAPES = [(2, 1, 128), (4, 4, 64), (4, 8, 128), (4, 6, 128), (2, 16, 64), (2, 2, 80)]


class Case:
    """Random q and an int8 KV cache [G, S_CAP, Dh] whose first `s_max` rows are filled."""

    def __init__(self, g: np.random.Generator, gk: int, rep: int, dh: int, s_max: int):
        self.h, self.gk, self.dh = gk * rep, gk, dh
        self.q = g.standard_normal((1, self.h, dh)).astype(np.float16).astype(np.float32)
        self.q *= np.float32(2.0) ** g.integers(-2, 3, (1, self.h, 1)).astype(np.float32)
        self.qd = cp.asarray(self.q)  # uploaded once: `run` is also captured in a graph
        k = g.standard_normal((s_max, gk, dh)).astype(np.float32)
        k *= g.uniform(0.2, 5, (s_max, gk, 1)).astype(np.float32)  # rows of different scales
        v = g.standard_normal((s_max, gk, dh)).astype(np.float32)
        self.kc, self.ks, self.k8, self.kd = int8_cache(k, S_CAP)
        self.vc, self.vs, self.v8, self.vd = int8_cache(v, S_CAP)
        self.scale = float(np.float32(1.0 / np.sqrt(dh)))
        self.dims = (self.h, gk, dh, dh)

    def run(self, K, ws, pos, out) -> None:
        attention_decode(K, ws, self.qd, self.kc, self.vc, pos, self.dims, self.scale, out,
                         self.ks, self.vs)  # fmt: skip

    def check(self, out, s: int) -> None:
        check(out, self.q, self.k8[:s], self.kd[:s], self.v8[:s], self.vd[:s], s - 1, self.scale)


@pytest.mark.parametrize("gk,rep,dh", SHAPES, ids=lambda v: str(v))
def test_attention_decode_int8_matches_reference(K, gk, rep, dh):
    c = Case(np.random.default_rng(), gk, rep, dh, S_CAP)
    ws = AttnWorkspace(cp, K, c.h, gk, S_CAP, dh, 1)
    out = cp.full((1, c.h * dh), np.nan, np.float32)
    pos = cp.zeros(1, np.int32)
    for s in SIZES:
        pos[...] = s - 1
        c.run(K, ws, pos, out)
        c.check(out, s)


@pytest.mark.parametrize("gk,rep,dh", [(4, 8, 128), (2, 16, 64), (4, 6, 128)], ids=str)
def test_attention_decode_int8_short_kernel_matches_reference(K, gk, rep, dh):
    c = Case(np.random.default_rng(), gk, rep, dh, S_CAP)
    ws = AttnWorkspace(cp, K, c.h, gk, S_CAP, dh, 1)
    ws.dec_nsplit = DEC_SHORT_GRID
    out = cp.full((1, c.h * dh), np.nan, np.float32)
    pos = cp.zeros(1, np.int32)
    for s in (1, 63, 65, 700, DEC_SHORT_MAX):
        pos[...] = s - 1
        c.run(K, ws, pos, out)
        c.check(out, s)


def test_attention_decode_int8_is_deterministic_and_replays_in_a_graph(K):
    c = Case(np.random.default_rng(), 4, 8, 128, S_CAP)
    ws = AttnWorkspace(cp, K, c.h, 4, S_CAP, 128, 1)
    out = cp.empty((1, c.h * 128), np.float32)
    pos = cp.asarray(np.array([4000], np.int32))
    outs = []
    for _ in range(3):
        c.run(K, ws, pos, out)
        outs.append(cp.asnumpy(out).view(np.uint32))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        c.run(K, ws, pos, out)
        graph = stream.end_capture()
        for s in (4096 + 17, 65, 1, S_CAP, 700):
            pos.set(np.array([s - 1], np.int32), stream=stream)
            out.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            c.check(out, s)


# ---- the whole model: CupyTier int8 against HostTier int8 ----
CASES = [
    ("qwen3moe", "IQ3_XXS", "Q8_0"),
    ("qwen3moe", "Q4_K", "Q6_K"),
    ("qwen2moe", "Q4_K", "Q8_0"),
]


@pytest.mark.parametrize("arch,quant,dense", CASES)
def test_int8_greedy_decode_matches_host_tier_for_32_steps(synth_model, device, arch, quant, dense):
    model = load_model(synth_model("tiny", quant, dense=dense, arch=arch, seed=7))
    host = Engine(model, tier=HostTier(model, n_ctx=128, kv_type="int8"))
    tier = CupyTier(model, n_ctx=128, budget=small_budget(), device=device, kv_type="int8")
    assert tier.k_cache.dtype == np.int8 and tier.k_scale.dtype == np.float32
    kv = tier.budget.reservations["kv"]
    arrays = (tier.k_cache, tier.v_cache, tier.k_scale, tier.v_scale)
    assert kv == sum(x.nbytes for x in arrays) == model.kv_bytes(128, "int8")
    dev = Engine(model, tier=tier, graphs=False)
    prompt = np.random.default_rng().integers(0, model.args.n_vocab, size=6).tolist()
    errs, gaps, apart = greedy_lockstep(host, dev, prompt, 32)
    assert np.all((errs <= FLIP_BOUND) | apart), errs
    assert np.all(gaps <= 2 * errs), f"greedy token differs beyond the logit error: {gaps}"
    # layer 0's rows depend on the token and position alone, the same on both sides: the two
    # tiers must have rounded them alike (a GEMV's float32 summation order apart)
    n = len(prompt) + 32
    for c8, sc, h8, hs in (
        (tier.k_cache, tier.k_scale, host.tier.k_cache, host.tier.k_scale),
        (tier.v_cache, tier.v_scale, host.tier.v_cache, host.tier.v_scale),
    ):
        got = cp.asnumpy(c8[0, :, :n]).transpose(1, 0, 2).astype(np.int32)  # [S, G, D]
        want = h8[0, :n].astype(np.int32)
        assert np.abs(got - want).max() <= 1 and np.mean(got == want) > 0.98
        assert np.abs(cp.asnumpy(sc[0, :, :n]).T / hs[0, :n] - 1).max() < 1e-4


def test_int8_graph_decode_equals_its_eager_launches(synth_model, device):
    from strata.build import build_engine
    from strata.config import resolve

    model = load_model(synth_model("tiny", "Q4_K", seed=21))

    def engine():
        flags = dict(device="gpu", n_ctx=96, adapt_swaps=0, threads=2, expert_cache="all",
                     kv_type="int8")  # fmt: skip
        return build_engine(model, resolve(flags, env={}))

    g, e = engine(), engine()
    assert g.tier.kv_type == "int8"
    e.tier.graph_decoder().replay = False
    prompt = np.random.default_rng().integers(0, model.args.n_vocab, 5).tolist()
    la, lb = g.forward(prompt), e.forward(prompt)
    assert np.array_equal(la, lb)
    for step in range(24):
        tok = int(np.argmax(lb))
        la, lb = g.forward([tok]), e.forward([tok])
        assert np.array_equal(la, lb), f"step {step}"
    assert g.stats.graph_steps == 24 and len(g.tier.graph_decoder().graphs)
