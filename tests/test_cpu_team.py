"""The resident team (strata/cpu/team.py): jobs reach every member, sleeping members wake, the
pool on the team gives the bits of the pool on parallel regions."""

from __future__ import annotations

import time

import numba
import numpy as np
import pytest
from numba import njit

from strata.bench.cpu_pool import _routes, make_layer
from strata.cpu import team as tm
from strata.cpu.kernels.dispatch import native_address
from strata.cpu.kernels.simd import atomic_load

pytestmark = pytest.mark.skipif(not tm.SUPPORTED, reason="no futex on this platform")


@njit(cache=True, nogil=True)
def _probe(tid, nt, jaddr):
    """Member tid's share of a probe job: out[tid] = 1000 * gen + tid + nt."""
    job = numba.carray(tm.address(jaddr), (64,), np.int64)
    job[tid] = 1000 * job[63] + tid + nt
    return 0


@njit(cache=True, nogil=True)
def _run_probe(ctl, fn, job, nt):
    target = tm.team_go(ctl, fn, job.ctypes.data, nt)
    _probe(0, nt, job.ctypes.data)
    tm.team_join(ctl, target)
    return atomic_load(ctl, tm.DONE)


def _wait_sleepers(team, n, limit=5.0):
    t_end = time.monotonic() + limit
    while team.ctl[tm.SLEEPERS] < n and time.monotonic() < t_end:
        time.sleep(0.001)
    return int(team.ctl[tm.SLEEPERS])


@pytest.mark.parametrize("spin_us", [0.0, 20000.0])
def test_every_member_runs_each_job_awake_or_asleep(spin_us):
    n = 4
    team = tm.Team(n, spin_us=spin_us)
    fn = native_address(_probe, (np.int64(0), np.int64(0), np.int64(0)), ())
    job = np.zeros(64, np.int64)
    rng = np.random.default_rng()
    done = 0
    try:
        for gen in rng.integers(1, 10**6, size=6):
            if spin_us == 0:  # members asleep in the kernel before each job: the job wakes them
                assert _wait_sleepers(team, n - 1) == n - 1
            job[:n] = -1
            job[63] = gen
            done = _run_probe(team.ctl, fn, job, n)
            assert job[:n].tolist() == [1000 * gen + t + n for t in range(n)]
        assert done == 6 * (n - 1)
    finally:
        team.close()
    assert not any(t.is_alive() for t in team._threads)
    assert not team.alive()


def test_team_refuses_one_thread():
    with pytest.raises(ValueError, match="at least 2"):
        tm.Team(1)


def test_shared_team_is_one_per_size():
    a, b = tm.shared_team(3), tm.shared_team(3)
    assert a is b and a.alive() and a.n == 3
    assert tm.shared_team(2) is not a


@pytest.mark.parametrize("quant,threads", [("IQ3_XXS", 3), ("Q4_K", 2)])
def test_pool_on_the_team_gives_the_bits_of_regions(quant, threads):
    from strata.cpu.pool import ExpertPool

    threads = min(threads, numba.config.NUMBA_NUM_THREADS)  # (the pool's cap)
    lw = make_layer("qwen3-30b-a3b", quant, seed=int(np.random.default_rng().integers(1 << 30)))
    rng = np.random.default_rng()
    team, region = ExpertPool(threads, team=True), ExpertPool(threads, team=False)
    for t in (1, 2, 9):
        x = rng.standard_normal((t, lw.gate.cols)).astype(np.float32)
        r = _routes(rng, t, lw.gate.n_expert, 8)
        ya = team.run_layer(x, *r, lw).copy()
        assert team._plans[id(lw)][3] is not None  # the call ran on the team
        yb = region.run_layer(x, *r, lw)
        np.testing.assert_array_equal(ya, yb)
        assert np.abs(ya).max() > 0
        ph = team.last_phases()  # the team stamps the same phases
        assert ph is not None and ph["total"][0] > 0 and ph["start"].shape == (threads,)
    tok, ex, w = _routes(rng, 1, lw.gate.n_expert, 8)
    x = rng.standard_normal((1, lw.gate.cols)).astype(np.float32)
    with pytest.raises(ValueError, match="expert id"):
        team.run_layer(x, tok, ex + lw.gate.n_expert, w, lw)
    np.testing.assert_array_equal(  # still serving after a refused call
        team.run_layer(x, tok, ex, w, lw), region.run_layer(x, tok, ex, w, lw)
    )


def test_team_is_the_default_from_team_min_threads():
    from strata.cpu.pool import ExpertPool
    from strata.cpu.pool.schedule import TEAM_MIN_THREADS

    assert ExpertPool(2).team == tm.SUPPORTED  # the decode step's team: nothing compiled twice
    assert TEAM_MIN_THREADS == 2
    assert not ExpertPool(1).team
    assert ExpertPool(2, team=True).team == tm.SUPPORTED
    assert not ExpertPool(2, team=False).team


def test_a_forked_child_starts_its_own_team():
    """Threads do not survive fork(): a pool used in a child process (a server's worker) starts
    a team there instead of waiting for members that do not exist."""
    import multiprocessing as mp

    from strata.cpu.pool import ExpertPool

    lw = make_layer("qwen3-30b-a3b", "IQ3_XXS", seed=int(np.random.default_rng().integers(1000)))
    rng = np.random.default_rng()
    x = rng.standard_normal((1, lw.gate.cols)).astype(np.float32)
    r = _routes(rng, 1, lw.gate.n_expert, 8)
    pool = ExpertPool(2, team=True)
    want = pool.run_layer(x, *r, lw).copy()  # the parent's team is running now
    ctx = mp.get_context("fork")
    q = ctx.Queue()

    def child():
        q.put(pool.run_layer(x, *r, lw).copy())

    p = ctx.Process(target=child)
    p.start()
    got = q.get(timeout=120)
    p.join(timeout=30)
    assert p.exitcode == 0
    np.testing.assert_array_equal(got, want)
