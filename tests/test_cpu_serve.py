"""The pool serving a queued decode step from routing records (strata/cpu/serve.py): a fake card
on another thread publishes each layer's record only after the host released the layer before,
and takes the pool's rows at each release; they must be the bits of `run_layer` on the same
misses, with the counts the engine's Python round keeps."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from strata.cpu import team as tm
from strata.cpu.pool import ExpertPool, prepare_layer
from strata.cpu.serve import StepServer
from strata.quant import fmt, random_quantized
from strata.quant.plan_record import BAD_ID, DONE, FILL, WAIT, record_views

pytestmark = pytest.mark.skipif(not tm.SUPPORTED, reason="no futex on this platform")

E, F, D, K = 8, 256, 512, 4  # experts, expert FFN, hidden, picks a token


class _T:
    def __init__(self, qt, shape, data):
        self.qtype, self.shape, self.data = qt, shape, data


def _layers(n_layer: int, quants: list[str], rng) -> list:
    out = []
    for i in range(n_layer):
        qt = fmt(quants[i % len(quants)]).qtype
        mats = [
            _T(qt, sh, random_quantized(qt, sh, rng, 1.0 / np.sqrt(sh[-1])))
            for sh in ((E, F, D), (E, F, D), (E, D, F))
        ]
        out.append(prepare_layer(*mats))
    return out


def _records(n_layer: int, rng) -> np.ndarray:
    """[L, R] uint32 records: picks (some resident, slot >= 0), weights, stats, h."""
    recs = np.zeros((n_layer, 4 * K + 4 + D), np.uint32)
    ri, rf = recs.view(np.int32), recs.view(np.float32)
    for i in range(n_layer):
        ids0 = rng.choice(E, K, replace=False).astype(np.int32)
        ids = ids0.copy()
        if rng.random() < 0.5:  # a CAR substitution: another expert in the first pick
            ids[0] = rng.choice(np.setdiff1d(np.arange(E), ids0))
        slot = np.where(rng.random(K) < 0.4, rng.integers(0, 32, K), -1).astype(np.int32)
        if i == 1:
            slot[:] = 3  # a layer with no misses
        ri[i, :K], ri[i, K : 2 * K], ri[i, 3 * K : 4 * K] = ids0, ids, slot
        rf[i, 2 * K : 3 * K] = rng.random(K).astype(np.float32)
        rf[i, 4 * K : 4 * K + 4] = (
            rng.integers(0, K),
            rng.integers(0, 2),
            (slot < 0).sum(),
            rng.random(),
        )
        rf[i, 4 * K + 4 :] = rng.standard_normal(D).astype(np.float32)
    return recs


class _FakeCard(threading.Thread):
    """Publishes record i (ready[i] = step) once the host released layer i - 1, and keeps
    y as it is at each release."""

    def __init__(self, ready, release, y, step, n_layer, delay_s=0.0):
        super().__init__(daemon=True)
        self.ready, self.release, self.y, self.step = ready, release, y, step
        self.n_layer, self.delay_s = n_layer, delay_s
        self.rows: list[np.ndarray] = []
        self.error: str | None = None

    def run(self):
        import time

        for i in range(self.n_layer):
            if i:
                want = (self.step * self.n_layer + i) & 0xFFFFFFFF
                t_end = time.monotonic() + 60
                while int(self.release[0]) != want:
                    if time.monotonic() > t_end:
                        self.error = f"no release of layer {i - 1}"
                        return
                self.rows.append(self.y.copy())
            if self.delay_s:
                time.sleep(self.delay_s)
            self.ready[i] = self.step
        t_end = time.monotonic() + 60
        want = (self.step * self.n_layer + self.n_layer) & 0xFFFFFFFF
        while int(self.release[0]) != want:
            if time.monotonic() > t_end:
                self.error = "no release of the last layer"
                return
        self.rows.append(self.y.copy())


def _want(pool_ref, layers, recs):
    """Each layer's rows from run_layer on the record's misses (zeros where it has none)."""
    ri, rf = recs.view(np.int32), recs.view(np.float32)
    out = []
    for i, lw in enumerate(layers):
        slot = ri[i, 3 * K : 4 * K]
        m = slot < 0
        if rf[i, 4 * K + 2] > 0 and m.any():
            ex = ri[i, K : 2 * K][m]
            w = rf[i, 2 * K : 3 * K][m]
            h = rf[i, 4 * K + 4 :].reshape(1, D).copy()
            out.append(pool_ref.run_layer(h, np.zeros(ex.size, np.int32), ex, w, lw).copy())
        else:
            out.append(None)  # y is not read by the card: any value
    return out


@pytest.mark.parametrize("quants", [["IQ3_XXS"], ["Q4_K", "IQ3_XXS", "Q6_K"]])
def test_a_step_served_in_one_call_gives_run_layers_bits(quants):
    rng = np.random.default_rng()
    n_layer = 4
    layers = _layers(n_layer, quants, rng)
    pool = ExpertPool(3, team=True)
    ref = ExpertPool(2, team=False)
    recs = _records(n_layer, rng)
    ready = np.zeros(n_layer, np.int32)
    release = np.zeros(1, np.uint32)
    y = np.full((1, D), np.nan, np.float32)
    hist = np.zeros((n_layer, E), np.int64)
    srv = StepServer.build(pool, layers, recs, ready, release, y, hist)
    assert srv is not None
    want = _want(ref, layers, recs)
    for step in (1, 2, 0x7FFFFFFF):  # the ticket wraps past 2^32 at the last
        ready[:] = 0
        release[0] = (step * n_layer) & 0xFFFFFFFF  # the step before ended there
        card = _FakeCard(ready, release, y, step, n_layer, delay_s=0.002 if step == 2 else 0.0)
        card.start()
        status, layer = DONE - 1, 0
        while status != DONE:
            status, layer = srv.run(step, layer, spins=1 << 12)
            assert status in (DONE, WAIT)
        card.join(60)
        assert card.error is None and len(card.rows) == n_layer
        for i in range(n_layer):
            if want[i] is not None:
                np.testing.assert_array_equal(card.rows[i], want[i])
                assert np.abs(want[i]).max() > 0
    ri, rf = recs.view(np.int32), recs.view(np.float32)
    want_hist = np.zeros_like(hist)
    for i in range(n_layer):
        np.add.at(want_hist[i], ri[i, :K], 3)
    np.testing.assert_array_equal(hist, want_hist)
    c = srv.take_counts()
    st = rf[:, 4 * K : 4 * K + 4].astype(np.float64)
    assert c["layers"] == 3 * n_layer
    assert c["misses"] == 3 * st[:, 2].sum() and c["substitutions"] == 3 * st[:, 1].sum()
    assert c["misses_before_car"] == 3 * st[:, 0].sum()
    assert c["ratio_sum"] == pytest.approx(3 * st[:, 3].sum())
    n_miss = sum(int((ri[i, 3 * K : 4 * K] < 0).sum()) for i in range(n_layer) if st[i, 2] > 0)
    assert c["gguf_bytes"] > 0 and n_miss > 0
    assert srv.take_counts()["layers"] == 0
    w = srv.windows(0, n_layer)
    assert w.shape == (n_layer, 3) and (w >= 0).all()


def test_a_record_not_ready_returns_wait_then_resumes():
    rng = np.random.default_rng()
    layers = _layers(2, ["IQ3_XXS"], rng)
    pool = ExpertPool(2, team=True)
    recs = _records(2, rng)
    ready, release = np.zeros(2, np.int32), np.zeros(1, np.uint32)
    y = np.zeros((1, D), np.float32)
    srv = StepServer.build(pool, layers, recs, ready, release, y, None)
    ready[0] = 5
    assert srv.run(5, 0, spins=100) == (WAIT, 1)  # layer 0 served, layer 1 not published
    assert int(release[0]) == 5 * 2 + 1
    ready[1] = 5
    assert srv.run(5, 1, spins=100) == (DONE, 2)
    assert int(release[0]) == 5 * 2 + 2


def test_missing_ram_expert_and_bad_id_go_back_to_python():
    rng = np.random.default_rng()
    layers = _layers(2, ["IQ3_XXS"], rng)
    pool = ExpertPool(2, team=True)
    recs = _records(2, rng)
    ri, rf = recs.view(np.int32), recs.view(np.float32)
    ri[1, 3 * K] = -1  # layer 1's first pick is the pool's
    rf[1, 4 * K + 2] = max(1, rf[1, 4 * K + 2])
    ready, release = np.full(2, 9, np.int32), np.zeros(1, np.uint32)
    y = np.zeros((1, D), np.float32)
    loaded = np.ones((2, E), bool)
    loaded[1, ri[1, K]] = False
    srv = StepServer.build(pool, layers, recs, ready, release, y, None, loaded)
    assert srv.run(9, 0) == (FILL, 1)
    assert int(release[0]) == 9 * 2 + 1  # layer 0 released, layer 1 left to Python
    assert srv.take_counts()["layers"] == 1
    loaded[1, :] = True  # the Python round filled it: a view, seen on the next run
    assert srv.run(9, 1) == (DONE, 2)
    ri[1, K] = E + 3
    assert srv.run(9, 1) == (BAD_ID, 1)


def test_no_server_without_a_team():
    rng = np.random.default_rng()
    layers = _layers(1, ["IQ3_XXS"], rng)
    recs = _records(1, rng)
    args = (layers, recs, np.zeros(1, np.int32), np.zeros(1, np.uint32))
    y = np.zeros((1, D), np.float32)
    assert StepServer.build(ExpertPool(2, team=False), *args, y, None) is None
    assert StepServer.build(ExpertPool(1, team=True), *args, y, None) is None
    wide = np.zeros((1, D + 1), np.float32)
    assert StepServer.build(ExpertPool(2, team=True), *args, wide, None) is None


def test_record_views_name_the_layout():
    recs = _records(3, np.random.default_rng())
    ri, rf = recs.view(np.int32), recs.view(np.float32)
    v = record_views(recs, K)
    for name, want in (
        ("ids0", ri[:, :K]),
        ("ids", ri[:, K : 2 * K]),
        ("weights", rf[:, 2 * K : 3 * K]),
        ("pair_slot", ri[:, 3 * K : 4 * K]),
        ("stats", rf[:, 4 * K : 4 * K + 4]),
        ("h", rf[:, 4 * K + 4 :]),
    ):
        assert v[name].dtype == want.dtype and np.array_equal(v[name], want)
        assert np.shares_memory(v[name], recs)
    assert v["h"].shape == (3, D)
