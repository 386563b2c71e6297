"""The CPU expert pool reproduces HostTier.experts (llama.cpp's roundings), deterministically,
without allocating per call; `import strata.cpu` stays free of the GPU tier and the server."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from gguf.constants import MODEL_TENSOR as MT
from gguf.quants import dequantize

from strata.cpu import ExpertPool, prepare_layer
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
    "quants",
    [("IQ3_XXS",) * 3, ("Q4_K", "Q4_K", "Q6_K"), ("IQ1_M",) * 3, ("MXFP4",) * 3],
    ids="-".join,
)
def test_pool_matches_the_numpy_expert_computation(quants):
    rng = np.random.default_rng()
    mats = _layer(rng, quants)
    x = rng.standard_normal((6, D)).astype(np.float32)
    ids, w = _routes(rng, 6, 3)
    got = ExpertPool(2).run_layer(x, *_flat(ids, w), *mats)
    assert_matches(got, reference_experts(x, ids, w, mats))


def test_pool_matches_host_tier_on_a_model(synth_model):
    from strata.cpu.tier import HostTier
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
def test_pool_is_deterministic_across_calls_threads_and_region_modes(t_n, k):
    rng = np.random.default_rng()
    lw = prepare_layer(*_layer(rng, ("IQ3_XXS",) * 3))
    x = rng.standard_normal((t_n, D)).astype(np.float32)
    args = _flat(*_routes(rng, t_n, k))
    first = ExpertPool(2, fused=False).run_layer(x, *args, lw).copy()
    for pool in (
        ExpertPool(2),  # fused after its first call
        ExpertPool(1),  # one thread: the static split, no region
        ExpertPool(2, row_chunk=8),  # smaller runs of down rows
        ExpertPool(2, team=True),  # the resident team (the default from 4 threads)
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

    from strata.cpu.pool.schedule import FUSED_LAYERS

    rng = np.random.default_rng()
    lw = prepare_layer(*_layer(rng, ("IQ3_XXS",) * 3))
    pool = ExpertPool(2, team=False)  # (the resident team needs no threading layer)
    x = rng.standard_normal((1, D)).astype(np.float32)
    for _ in range(2):
        pool.run_layer(x, *_flat(*_routes(rng, 1, 2)), lw)
    assert pool._fused_ok == (numba.threading_layer() in FUSED_LAYERS)
    assert pool._knobs(True)[1] == 1  # the fused region splits any quantization
    assert pool._knobs(False)[1] == 16  # one region a phase: not below 16 rows


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


@pytest.mark.parametrize("quant", ["IQ3_XXS", "IQ1_M", "MXFP4"])
@pytest.mark.parametrize("t_n", [1, 6])
def test_pool_on_the_hosts_layout_gives_the_portable_kernels_bits(quant, t_n):
    """The host's kernels and layouts (IQ3_XXS: pm or lut4, IQ1_M: t2, MXFP4: its GGUF bytes)
    against the portable kernels on the GGUF bytes, bit for bit."""
    rng = np.random.default_rng()
    mats = _layer(rng, (quant,) * 3)
    x = rng.standard_normal((t_n, D)).astype(np.float32)
    ids, w = _routes(rng, t_n, 3)
    host, portable = prepare_layer(*mats), prepare_layer(*mats, simd=False)
    assert portable.gate.layout == "gguf"
    pool = ExpertPool(2)
    got = pool.run_layer(x, *_flat(ids, w), host).copy()
    np.testing.assert_array_equal(got, pool.run_layer(x, *_flat(ids, w), portable))
    assert_matches(got, reference_experts(x, ids, w, mats))


def test_unit_table_covers_every_row_once():
    """_unit_table's units tile each active expert's rows exactly."""
    from strata.cpu.pool.schedule import _unit_table

    rng = np.random.default_rng()
    n_expert, rows, nt, units = 16, int(rng.integers(40, 800)), 4, 16
    counts = rng.integers(0, 4, n_expert)
    counts[rng.integers(0, n_expert)] += 1  # at least one task
    start = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    cnt = (start + counts).astype(np.int64)
    active = np.flatnonzero(counts).astype(np.int64)
    na, n = active.size, int(counts.sum())
    uf, ur = np.zeros(n_expert + 1, np.int64), np.zeros(n_expert, np.int64)
    _unit_table(n, na, rows, units, nt, start, cnt, active, uf, ur)
    for ia in range(na):  # units of expert slot ia tile rows 0..rows-1
        k = uf[ia + 1] - uf[ia]
        assert ur[ia] >= 1 and k == -(-rows // ur[ia])
