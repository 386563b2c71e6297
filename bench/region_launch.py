"""What starting work on N host threads costs: a Numba parallel region (prange over N, one
iteration a thread) against a resident team (strata/cpu/team.py: Python threads in nogil compiled
loops, spinning on a shared word), each thread doing nothing but stamping its entry.

    python bench/region_launch.py [--threads N] [--calls 20000]

Prints the median microseconds of a call from Python (empty call for scale) and of the slowest
thread's entry after the caller's stamp.
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
from numba import njit, prange

from strata.cpu.kernels.dispatch import native_address
from strata.cpu.kernels.simd import cycle_counter
from strata.cpu.pool import tick_hz
from strata.cpu.team import Team, address, team_go, team_join


@njit(cache=True)
def _empty(stamps, nt):
    stamps[nt, 0] = cycle_counter()
    return 0


@njit(parallel=True, cache=True)
def _region(stamps, nt):
    stamps[nt, 0] = cycle_counter()
    for t in prange(nt):
        stamps[t, 0] = cycle_counter()
    return 0


@njit(parallel=True, cache=True)
def _region_args(
    stamps,
    nt,
    a0,
    a1,
    a2,
    a3,
    a4,
    a5,
    a6,
    a7,
    a8,
    a9,
    a10,
    a11,
    a12,
    a13,
    a14,
    a15,
    a16,
    a17,
    a18,
    a19,
    a20,
    a21,
    a22,
    a23,
    a24,
    a25,
    a26,
    a27,
    a28,
    a29,
    a30,
    a31,
    a32,
    a33,
    a34,
    a35,
    a36,
    a37,
    a38,
    a39,
):
    stamps[nt, 0] = cycle_counter()
    for t in prange(nt):  # every array is used inside, so each is passed to the region
        stamps[t, 0] = cycle_counter()
        a0[t] += (
            a1[t]
            + a2[t]
            + a3[t]
            + a4[t]
            + a5[t]
            + a6[t]
            + a7[t]
            + a8[t]
            + a9[t]
            + a10[t]
            + a11[t]
            + a12[t]
            + a13[t]
            + a14[t]
            + a15[t]
            + a16[t]
            + a17[t]
            + a18[t]
            + a19[t]
            + a20[t]
            + a21[t]
            + a22[t]
            + a23[t]
            + a24[t]
            + a25[t]
            + a26[t]
            + a27[t]
            + a28[t]
            + a29[t]
            + a30[t]
            + a31[t]
            + a32[t]
            + a33[t]
            + a34[t]
            + a35[t]
            + a36[t]
            + a37[t]
            + a38[t]
            + a39[t]
        )
    return 0


@njit(nogil=True, cache=True)
def _stamp_job(tid, nt, jaddr):
    """A team member's job: stamp its entry (the job's address is the stamps array)."""
    st = numba.carray(address(jaddr), (nt + 1, 16), np.int64)
    st[tid, 0] = cycle_counter()
    return 0


@njit(nogil=True, cache=True)
def _team_call(ctl, fn, stamps, nt):
    stamps[nt, 0] = cycle_counter()
    target = team_go(ctl, fn, stamps.ctypes.data, nt)
    stamps[0, 0] = cycle_counter()
    team_join(ctl, target)
    return 0


def _median_us(fn, stamps, nt, calls, hz):
    fn(stamps, nt)
    wall, start = [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(stamps, nt)
        wall.append(time.perf_counter() - t0)
        start.append((stamps[:nt, 0].max() - stamps[nt, 0]) / hz)
    return np.median(wall) * 1e6, np.median(start) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    ap.add_argument("--calls", type=int, default=20000)
    ns = ap.parse_args()
    nt = ns.threads
    numba.set_num_threads(nt)
    hz = tick_hz()
    stamps = np.zeros((nt + 1, 16), np.int64)
    team = Team(nt)
    z = np.int64(0)
    job_fn = native_address(_stamp_job, (z, z, z), ())
    arrs = tuple(np.zeros(64, np.float32) for _ in range(40))
    arms = (
        ("parallel region", _region),
        ("region, 40 arrays", lambda st, n: _region_args(st, n, *arrs)),
        ("team", lambda st, n: _team_call(team.ctl, job_fn, st, n)),
    )
    w, _ = _median_us(_empty, stamps, nt, ns.calls, hz)
    print(f"{nt} threads, {'empty call':18s}: call {w:7.2f} us")
    for name, fn in arms:
        w, s = _median_us(fn, stamps, nt, ns.calls, hz)
        print(f"{nt} threads, {name:18s}: call {w:7.2f} us, last thread in after {s:7.2f} us")
    team.close()


if __name__ == "__main__":
    main()
