"""The CPU expert pool reproduces HostTier.experts (llama.cpp's roundings), deterministically,
without allocating per call; `import strata.cpu` stays free of the GPU tier and the server."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from gguf.constants import MODEL_TENSOR as MT
from gguf.quants import dequantize

from strata.cpu import ExpertPool, prepare_layer
from strata.cpu.kernels.simd import avx512_enabled, simd_enabled
from strata.quant import fmt, random_quantized, roundtrip
from strata.quant.formats import QT

E, F, D = 8, 256, 512
# per-token tolerance: most tokens agree to float32 noise; a Q8 rounding flip of one
# intermediate value (float32 noise on a .5 boundary) moves a token by about one quant step
TOL, MIN_FRAC, FLIP_BOUND = 2e-5, 0.6, 2e-2


class _T:
    def __init__(self, qtype, shape, data):
        self.qtype, self.shape, self.data = qtype, shape, data


def _layer(rng, quants):
    shapes = ((E, F, D), (E, F, D), (E, D, F))
    return [
        _T(fmt(q).qtype, s, random_quantized(fmt(q).qtype, s, rng, 1 / np.sqrt(s[-1])))
        for q, s in zip(quants, shapes, strict=True)
    ]


def _routes(rng, t_n, k):
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(t_n)])  # [T, K]
    w = rng.uniform(0.1, 1.0, (t_n, k)).astype(np.float32)
    return ids, w


def _flat(ids, w):
    tok = np.repeat(np.arange(ids.shape[0]), ids.shape[1]).astype(np.int32)
    return tok, ids.ravel().astype(np.int32), w.ravel()


def reference_experts(x, ids, w, mats):
    """HostTier.experts' arithmetic on the same tensors (NumPy, float32, ggml's roundings)."""
    g, u, d = mats
    vg, vu, vd = (fmt(m.qtype).vec_dot for m in mats)
    out = np.zeros_like(x)
    hg, hu = roundtrip(x, vg), roundtrip(x, vu)
    for e in np.unique(ids[ids >= 0]):
        rows, ks = np.nonzero(ids == e)
        a = hg[rows] @ dequantize(g.data[e], g.qtype).T
        b = hu[rows] @ dequantize(u.data[e], u.qtype).T
        act = a / (np.float32(1.0) + np.exp(-a)) * b
        y = roundtrip(act, vd) @ dequantize(d.data[e], d.qtype).T
        out[rows] += w[rows, ks][:, None] * y
    return out


def assert_matches(got, want):
    errs = np.abs(got - want).max(axis=1) / np.abs(want).max()
    assert (errs <= TOL).mean() >= MIN_FRAC, np.sort(errs)[::-1][:6]
    assert errs.max() <= FLIP_BOUND, errs.max()


@pytest.mark.parametrize(
    "quants", [("IQ3_XXS",) * 3, ("Q4_K", "Q4_K", "Q6_K"), ("IQ1_M",) * 3], ids="-".join
)
def test_pool_matches_the_numpy_expert_computation(quants):
    rng = np.random.default_rng()
    mats = _layer(rng, quants)
    x = rng.standard_normal((6, D)).astype(np.float32)
    ids, w = _routes(rng, 6, 3)
    got = ExpertPool(2).run_layer(x, *_flat(ids, w), *mats)
    assert_matches(got, reference_experts(x, ids, w, mats))


def test_pool_matches_host_tier_on_a_model(synth_model):
    from strata.gpu.host import HostTier
    from strata.model.loader import load_model

    model = load_model(synth_model("tiny", quant="IQ3_XXS"))
    host = HostTier(model, n_ctx=16, expert_cache_mib=64)
    rng = np.random.default_rng()
    a = model.args
    x = rng.standard_normal((5, a.n_embd)).astype(np.float32)
    ids = np.stack([rng.choice(a.n_expert, a.n_expert_used, replace=False) for _ in range(5)])
    ids[2, 0] = -1  # an expert another tier runs: not ours
    w = rng.uniform(0.1, 1.0, ids.shape).astype(np.float32)
    layer = 1
    want = host.experts(layer, x, ids, w)
    keep = ids >= 0
    tok = np.nonzero(keep)[0].astype(np.int32)
    got = ExpertPool(2).run_layer(
        x,
        tok,
        ids[keep].astype(np.int32),
        w[keep],
        *(model.tensor(m, layer) for m in (MT.FFN_GATE_EXP, MT.FFN_UP_EXP, MT.FFN_DOWN_EXP)),
    )
    assert_matches(got, want)


# (70, 8): 560 tasks, past the expert-major down's outputs (YB_BYTES at D = 512: 512 tasks)
@pytest.mark.parametrize("t_n,k", [(9, 3), (1, 1), (1, 2), (2, 8), (70, 8)])
def test_pool_is_deterministic_across_calls_threads_region_modes_and_quant_arms(t_n, k):
    rng = np.random.default_rng()
    lw = prepare_layer(*_layer(rng, ("IQ3_XXS",) * 3))
    x = rng.standard_normal((t_n, D)).astype(np.float32)
    args = _flat(*_routes(rng, t_n, k))
    first = ExpertPool(2, fused=False).run_layer(x, *args, lw).copy()
    for pool in (
        ExpertPool(2),  # fused after its first call
        ExpertPool(1),
        ExpertPool(2, parallel_quant=False),
        ExpertPool(2, quant_min_tasks=1),
        ExpertPool(2, quant_min_tasks=1, fused=False),
        ExpertPool(2, parallel_quant=False, fused=False),
        ExpertPool(2, prefetch_l2=True, prefetch_bytes=16384),  # prefetch: placement, not bits
        ExpertPool(2, units=0, down_units=0),  # the static split
        ExpertPool(2, units=0, down_units=0, fused=False),
        ExpertPool(2, units=1, down_units=1),  # one unit a thread: all taken statically
        ExpertPool(2, units=300, down_units=0),  # one-row gate/up units
        ExpertPool(2, units=0, down_units=300),  # the smallest down units
        ExpertPool(2, wait_prefetch=False),  # barriers that only wait
        ExpertPool(2, down_by_expert=False),  # down in runs of rows of every expert
        ExpertPool(2, down_by_expert=False, units=0, down_units=0),
        ExpertPool(2, team=True),  # the resident team (the default from 4 threads)
        ExpertPool(2, eager_quant=True, team=True),  # the intermediate quantized inside gate/up
        ExpertPool(2, eager_quant=True, team=False),  # ... in a parallel region
        ExpertPool(2, pipeline=True, team=True),  # no barrier between gate/up, quant, down
        ExpertPool(2, pipeline=True, team=False),
        ExpertPool(2, pipeline=True, units=300),  # one-row units: many chunk completions
        ExpertPool(2, tail_split=4),  # the last units a thread's worth, 4x smaller
        ExpertPool(2, tail_split=1000, team=True),  # ... one row each
        ExpertPool(2, tail_split=3, pipeline=True),
    ):
        for _ in range(3):
            assert np.array_equal(pool.run_layer(x, *args, lw), first)


@pytest.mark.parametrize("team", [False, True])
def test_pool_gives_a_fresh_pools_bits_across_shapes_layers_and_clear_prepared(team):
    """A pool's cached plans and workspaces never leak between calls: reused over growing and
    shrinking T and N, two layers of other formats, clear_prepared() and a Numba thread count
    changed behind its back, it gives, call by call, the bits of a pool that has never run. On
    parallel regions the pool restores its thread count; on the resident team it needs none."""
    import numba

    rng = np.random.default_rng()
    layers = [_layer(rng, ("IQ3_XXS",) * 3), _layer(rng, ("Q4_K", "Q4_K", "Q6_K"))]
    pool = ExpertPool(2, team=team)
    for i, (t_n, k) in enumerate([(1, 2), (7, 3), (2, 1), (12, 4), (1, 8), (3, 2), (5, 1)]):
        mats = layers[i % 2]
        x = rng.standard_normal((t_n, D)).astype(np.float32)
        args = _flat(*_routes(rng, t_n, k))
        if i == 3:
            pool.clear_prepared()
        if i == 4:
            numba.set_num_threads(1)  # another caller's setting: the pool restores its own
        got = pool.run_layer(x, *args, *mats).copy()
        assert numba.get_num_threads() == (1 if pool.team and i == 4 else pool.n_threads)
        assert np.array_equal(got, ExpertPool(2, team=False).run_layer(x, *args, *mats))
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


def test_pool_fuses_its_phases_into_one_region_where_the_threading_layer_allows():
    import numba

    from strata.cpu.pool import FUSED_LAYERS

    rng = np.random.default_rng()
    lw = prepare_layer(*_layer(rng, ("IQ3_XXS",) * 3))
    pool = ExpertPool(2, team=False)  # (the resident team needs no threading layer)
    x = rng.standard_normal((1, D)).astype(np.float32)
    for _ in range(2):
        pool.run_layer(x, *_flat(*_routes(rng, 1, 2)), lw)
    assert pool._fused_ok == (numba.threading_layer() in FUSED_LAYERS)
    assert pool._knobs(True)[2] == 1  # the fused region splits any quantization
    assert ExpertPool(2, quant_min_tasks=5)._knobs(True)[2] == 5


@pytest.mark.parametrize("threads,fused", [(1, True), (2, True), (2, False)])
def test_pool_traces_where_each_threads_time_went(threads, fused):
    from strata.cpu.pool import TRACE_STAMPS

    rng = np.random.default_rng()
    lw = prepare_layer(*_layer(rng, ("Q4_K",) * 3))
    pool = ExpertPool(threads, fused=fused)
    x = rng.standard_normal((3, D)).astype(np.float32)
    for _ in range(3):  # the first call learns the threading layer outside the fused region
        pool.run_layer(x, *_flat(*_routes(rng, 3, 2)), lw)
    ph = pool.last_phases()
    if threads > 1 and not (fused and (pool._fused_ok or pool.team)):
        assert ph is None  # one region a phase: no per-thread phases
        return
    assert list(ph) == ["start", *TRACE_STAMPS[1:], "join", "total"]
    per_thread = sum(ph[k] for k in ph if k != "total")  # the stamps telescope
    np.testing.assert_allclose(per_thread, ph["total"][0], rtol=1e-9)
    assert all((ph[k] >= 0).all() and ph[k].shape == (threads,) for k in ph if k != "total")
    assert ph["gate_up"].max() > 0 and ph["down"].max() > 0
    if threads > 1:  # the barrier waits line the threads up: each leaves it after all arrive
        arrive = ph["start"] + ph["quant_x"]
        leave = arrive + ph["barrier1"]
        assert leave.min() >= arrive.max() - 1e-9
    # 6 tasks: the expert-major down in the fused region (its outputs summed after a barrier)
    two_phase = threads > 1 and fused
    assert (ph["reduce"].max() > 0) == two_phase and (ph["barrier4"].max() > 0) == two_phase


def test_pool_reuses_its_workspaces():
    rng = np.random.default_rng()
    lw = prepare_layer(*_layer(rng, ("IQ3_XXS",) * 3))
    pool = ExpertPool(2)
    x = rng.standard_normal((4, D)).astype(np.float32)
    y1 = pool.run_layer(x, *_flat(*_routes(rng, 4, 2)), lw)
    ws = dict(pool._ws)
    y2 = pool.run_layer(x[:3], *_flat(*_routes(rng, 3, 2)), lw)
    assert np.shares_memory(y1, y2)  # the same output buffer
    assert all(pool._ws[k] is v for k, v in ws.items() if isinstance(v, np.ndarray | tuple))
    lw2 = prepare_layer(*_layer(rng, ("IQ3_XXS",) * 3))  # another layer of the same shapes
    pool.run_layer(x[:2], *_flat(*_routes(rng, 2, 2)), lw2)
    assert all(pool._ws[k] is v for k, v in ws.items() if isinstance(v, np.ndarray | tuple))
    out = np.empty((3, D), np.float32)
    assert pool.run_layer(x[:3], *_flat(*_routes(rng, 3, 2)), lw, out=out) is out


def test_pool_counts_the_bytes_of_the_experts_it_read():
    rng = np.random.default_rng()
    lw = prepare_layer(*_layer(rng, ("IQ3_XXS",) * 3))
    pool = ExpertPool(2)
    ids, w = _routes(rng, 2, 3)
    pool.run_layer(rng.standard_normal((2, D)).astype(np.float32), *_flat(ids, w), lw)
    n = np.unique(ids).size
    assert pool.last_active_experts == n
    assert pool.last_gguf_bytes == n * 3 * fmt(QT.IQ3_XXS).tensor_bytes((F, D))
    assert pool.last_bytes == n * lw.expert_nbytes >= pool.last_gguf_bytes


def test_pool_without_tasks_returns_zeros_and_refuses_bad_ids():
    rng = np.random.default_rng()
    lw = prepare_layer(*_layer(rng, ("IQ3_XXS",) * 3))
    pool = ExpertPool(2)
    x = rng.standard_normal((2, D)).astype(np.float32)
    pool.run_layer(x, *_flat(*_routes(rng, 2, 2)), lw)  # leave garbage in the workspace
    empty = np.zeros(0, np.int32)
    assert not pool.run_layer(x, empty, empty, np.zeros(0, np.float32), lw).any()
    one = np.ones(1, np.float32)
    with pytest.raises(ValueError, match="token index"):
        pool.run_layer(x, np.array([2], np.int32), np.array([0], np.int32), one, lw)
    with pytest.raises(ValueError, match="expert id"):
        pool.run_layer(x, np.array([0], np.int32), np.array([E], np.int32), one, lw)


def test_pool_knobs_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("STRATA_POOL_PARALLEL_QUANT", "0")
    monkeypatch.setenv("STRATA_POOL_QUANT_MIN_TASKS", "32")
    monkeypatch.setenv("STRATA_POOL_FUSED", "0")
    monkeypatch.setenv("STRATA_POOL_PREFETCH_L2", "1")
    monkeypatch.setenv("STRATA_POOL_UNITS", "0")
    monkeypatch.setenv("STRATA_POOL_DOWN_UNITS", "2")
    monkeypatch.setenv("STRATA_POOL_WAIT_PREFETCH", "0")
    monkeypatch.setenv("STRATA_POOL_DOWN_BY_EXPERT", "0")
    monkeypatch.setenv("STRATA_POOL_EAGER_QUANT", "1")
    monkeypatch.setenv("STRATA_POOL_PIPELINE", "1")
    monkeypatch.setenv("STRATA_POOL_TAIL_SPLIT", "3")
    pool = ExpertPool(1)
    assert pool.tail_split == 3 and ExpertPool(1, tail_split=1).tail_split == 1
    with pytest.raises(ValueError, match="tail_split must be >= 1"):
        ExpertPool(1, tail_split=0)
    assert pool.pipeline and not ExpertPool(1, pipeline=False).pipeline
    assert pool.eager_quant and not ExpertPool(1, eager_quant=False).eager_quant
    assert (pool.units, pool.down_units, pool.wait_prefetch) == (0, 2, False)
    assert not pool.down_by_expert and ExpertPool(1, down_by_expert=True).down_by_expert
    assert ExpertPool(1, units=4).units == 4  # flags beat the environment
    with pytest.raises(ValueError, match="units must be >= 0"):
        ExpertPool(1, down_units=-1)
    assert (pool.parallel_quant, pool.quant_min_tasks, pool.fused) == (False, 32, False)
    assert pool.prefetch_l2 and not ExpertPool(1, prefetch_l2=False).prefetch_l2
    assert pool._knobs(True)[2] == 32  # a set threshold holds in the fused region too
    assert ExpertPool(1, parallel_quant=True, fused=True).parallel_quant
    assert ExpertPool(1, fused=True).fused


def test_cpu_pool_arm_reports_bandwidth(tmp_path):
    from strata.bench.cpu_pool import run_cpu_pool_arm

    path = tmp_path / "arm.json"
    res = run_cpu_pool_arm(
        "tiny", "IQ3_XXS", tokens=1, threads=1, repeats=2, json_path=str(path), print_table=False
    )
    assert json.loads(path.read_text())["quant"] == "IQ3_XXS"
    assert res["tokens"] == 1 and res["experts_per_token"] == 2
    assert res["weight_bytes_read"] >= res["weight_bytes_gguf"] > 0
    assert res["gbps_gguf"] > 0 and res["host_read_gbps"] > 0
    assert res["ratio_gguf"] == pytest.approx(res["gbps_gguf"] / res["host_read_gbps"])
    own = res["weights_read_gbps"]  # a read of the pool's own weight pages
    assert own > 0 and res["ratio_gguf_weights"] == pytest.approx(res["gbps_gguf"] / own)


def test_importing_strata_cpu_pulls_in_no_gpu_engine_or_server():
    code = (
        "import sys, strata.cpu\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('cupy', 'starlette', 'uvicorn')\n"
        "       or m.startswith(('strata.engine', 'strata.gpu', 'strata.serve'))]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_layout_ab_times_both_layouts_on_the_same_experts():
    from strata.bench.cpu_pool import format_layout_ab, format_phases, run_layout_ab

    rows = run_layout_ab("tiny", "IQ3_XXS", ("repack", "gguf"), tokens=2, threads=1, repeats=3,
                         print_table=False)  # fmt: skip
    repack = "pm" if avx512_enabled() else "lut4"  # IQ3_XXS's repack on this host
    assert [r["layout"].split("/")[0] for r in rows] == (
        [repack, "gguf"] if simd_enabled() else ["gguf", "gguf"]
    )
    # the same experts and routings: the GGUF bytes agree, the repack reads more of them
    assert rows[0]["weight_bytes_gguf"] == rows[1]["weight_bytes_gguf"] > 0
    assert rows[0]["weight_bytes_read"] >= rows[1]["weight_bytes_read"]
    for r in rows:
        assert 0 < r["seconds_best"] <= r["seconds"]
        assert r["ratio_gguf"] == pytest.approx(r["gbps_gguf"] / r["host_read_gbps"])
        # rates from the median call, not the mean (one descheduled call would drag it)
        assert r["gbps_gguf"] == pytest.approx(r["weight_bytes_gguf"] / r["seconds"] / 1e9)
    assert len(format_layout_ab(rows).splitlines()) == 3
    # one thread runs the fused path: every arm carries its phases, and the table shows them
    assert all(r["phases_us"]["gate_up"]["max"] > 0 for r in rows)
    table = format_phases(rows).splitlines()
    assert len(table) == 4 + 2 * len(rows)  # head, one row an arm, then each arm's slowest call
    assert all(f"{r['calls_over_2x_median']} calls over 2x" in t
               for r, t in zip(rows, table[5::2], strict=True))  # fmt: skip


def test_layout_ab_arms_carry_pool_prefetch_options():
    from strata.bench.cpu_pool import arm_spec, run_layout_ab
    from strata.cpu.pool import DEFAULT_DOWN_UNITS, DEFAULT_UNITS

    assert arm_spec("gguf") == ("gguf", {})
    want = ("repack", {"prefetch_l2": True, "prefetch_bytes": 8192})
    assert arm_spec("repack@l2@pf=8192") == want
    assert arm_spec("repack@u=0@d=2") == ("repack", {"units": 0, "down_units": 2})
    assert arm_spec("gguf@wp=0") == ("gguf", {"wait_prefetch": False})
    assert arm_spec("gguf@dx=0") == ("gguf", {"down_by_expert": False})
    assert arm_spec("pm@eq=0") == ("pm", {"eager_quant": False})
    assert arm_spec("pm@pl=1") == ("pm", {"pipeline": True})
    assert arm_spec("t2@ts=4") == ("t2", {"tail_split": 4})
    with pytest.raises(ValueError, match="unknown pool option 'x'"):
        arm_spec("gguf@x")
    rows = run_layout_ab("tiny", "IQ1_M", ("gguf", "gguf@l2@pf=8192"), tokens=1, threads=1,
                         repeats=2, print_table=False)  # fmt: skip
    assert [(r["prefetch_l2"], r["prefetch_bytes"]) for r in rows] == [(False, 4096), (True, 8192)]
    assert [(r["units"], r["down_units"]) for r in rows] == [
        (DEFAULT_UNITS, DEFAULT_DOWN_UNITS)
    ] * 2
    assert rows[1]["layout"].endswith("@l2@pf=8192")
    assert rows[0]["weight_bytes_read"] == rows[1]["weight_bytes_read"] > 0  # one layer, shared


@pytest.mark.parametrize("t_n", [1, 6])
def test_pool_on_the_pm_layout_gives_the_gguf_layouts_bits(t_n):
    """IQ3_XXS repacked position-major (its AVX-512 kernel reads the quantizer's position-major
    quants, phases 1 and 3) against the same experts on the GGUF bytes, bit for bit."""
    rng = np.random.default_rng()
    mats = _layer(rng, ("IQ3_XXS",) * 3)
    x = rng.standard_normal((t_n, D)).astype(np.float32)
    ids, w = _routes(rng, t_n, 3)
    pm, gguf = (prepare_layer(*mats, layout=lay) for lay in ("IQ3_XXS=pm", "gguf"))
    assert pm.gate.layout == "pm" and gguf.gate.layout == "gguf"
    pool = ExpertPool(2)
    got = pool.run_layer(x, *_flat(ids, w), pm)
    np.testing.assert_array_equal(got, pool.run_layer(x, *_flat(ids, w), gguf))
    assert_matches(got, reference_experts(x, ids, w, mats))


def test_layout_ab_arms_may_name_a_kernel():
    from strata.bench.cpu_pool import arm_spec, run_layout_ab
    from strata.cpu.kernels import dispatch as K

    assert arm_spec("gguf@k=8") == ("gguf", {"kernel": 8})
    rows = run_layout_ab("tiny", "IQ3_XXS", ("gguf@k=8", "IQ3_XXS=pm@k=43"), tokens=1,
                         threads=1, repeats=2, print_table=False)  # fmt: skip
    assert [r["kernels"] for r in rows] == [[K.K_IQ3_XXS] * 3, [K.K_IQ3_XXS_PM] * 3]
    with pytest.raises(ValueError, match="no kernel code 999"):
        run_layout_ab("tiny", "IQ3_XXS", ("gguf@k=999",), tokens=1, threads=1, repeats=1)


def test_bench_routes_at_t1_bring_no_expert_back_within_a_pass():
    from strata.bench.cpu_pool import _route_seq

    routes = _route_seq(np.random.default_rng(), 40, 1, 128, 8)
    ids = [r[1] for r in routes]
    for p in range(2):  # each pass of 16 calls reads every expert exactly once
        assert sorted(np.concatenate(ids[16 * p : 16 * (p + 1)]).tolist()) == list(range(128))
    tok, _, w = routes[0]
    assert tok.tolist() == [0] * 8 and w.dtype == np.float32 and abs(w.sum() - 1) < 1e-6
    assert len(_route_seq(np.random.default_rng(), 3, 4, 128, 8)[0][0]) == 32  # T > 1: random


@pytest.mark.parametrize("team", [False, True])
def test_pipelined_pool_runs_without_the_barriers_after_gate_up(team):
    """With `pipeline` a decode layer's down starts expert by expert as intermediates are
    quantized and each chunk of outputs is summed by the thread that completes it: the phases
    between gate/up and down (barrier2, quant_h, barrier3, barrier4, reduce) take no time on any
    thread, where the barriered pool spends time quantizing; the same bits."""
    rng = np.random.default_rng()
    lw = prepare_layer(*_layer(rng, ("IQ3_XXS",) * 3))
    x = rng.standard_normal((1, D)).astype(np.float32)
    args = _flat(*_routes(rng, 1, 8))
    gone = ("barrier2", "quant_h", "barrier3", "barrier4", "reduce")
    barriered, piped = ExpertPool(2, team=team), ExpertPool(2, team=team, pipeline=True)
    for _ in range(2):  # (a region pool learns its threading layer on its first call)
        want = barriered.run_layer(x, *args, lw).copy()
        got = piped.run_layer(x, *args, lw)
    assert np.array_equal(got, want)
    ph = piped.last_phases()
    assert all(np.all(ph[k] == 0) for k in gone) and np.all(ph["down"] > 0)
    assert np.any(barriered.last_phases()["quant_h"] > 0)


@pytest.mark.parametrize("tail", [1, 2, 4, 1000])
def test_unit_table_covers_every_row_once_and_cuts_the_last_units(tail):
    """_unit_table's units tile each active expert's rows exactly; with tail > 1 the trailing
    expert slots whose units make up the schedule's last nt are cut that many times smaller
    (at least one row), the others keep the uniform size."""
    from strata.cpu.pool import _unit_table

    rng = np.random.default_rng()
    n_expert, rows, nt, units = 16, int(rng.integers(40, 800)), 4, 16
    counts = rng.integers(0, 4, n_expert)
    counts[rng.integers(0, n_expert)] += 1  # at least one task
    start = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    cnt = (start + counts).astype(np.int64)
    active = np.flatnonzero(counts).astype(np.int64)
    na, n = active.size, int(counts.sum())
    uf, ur = np.zeros(n_expert + 1, np.int64), np.zeros(n_expert, np.int64)
    base_f, base_r = uf.copy(), ur.copy()
    _unit_table(n, na, rows, units, nt, start, cnt, active, base_f, base_r, 1)
    _unit_table(n, na, rows, units, nt, start, cnt, active, uf, ur, tail)
    for ia in range(na):  # units of expert slot ia tile rows 0..rows-1
        k = uf[ia + 1] - uf[ia]
        assert ur[ia] >= 1 and k == -(-rows // ur[ia])
    if tail == 1:
        assert np.array_equal(uf, base_f) and np.array_equal(ur, base_r)
        return
    covered, ia = 0, na - 1
    while covered < nt and ia >= 0:  # the slots holding the last nt uniform units: all cut
        assert ur[ia] == max(1, base_r[ia] // tail)
        covered += base_f[ia + 1] - base_f[ia]
        ia -= 1
    assert np.array_equal(ur[: ia + 1], base_r[: ia + 1])  # the rest as before
