"""A resident team of host threads for the CPU pool: work starts without a parallel region.

A Numba parallel region costs its caller several microseconds before the last thread runs (the
gufunc's arguments are marshalled, the OpenMP team released); a T = 1 decode layer of the pool
has ~0.2 ms of work, so that start is a few percent of every layer (bench/region_launch.py). A
`Team` keeps n - 1 Python threads inside one compiled loop each (`_member`, no GIL held) that
waits on a generation word; the caller publishes a job (a native function's address and a
descriptor's address), counts the word up and runs share 0 itself. Members that find no job for
`spin_us` sleep in the kernel (Linux futex) and the next job wakes them; an idle server costs
nothing.

    ctl: int64 [CTL_LEN], cache-line slots below (the team's control block)
    job function: int64 fn(int64 tid, int64 nt, int64 job, 0, 0, 0) (a C ABI address; the
                  three zeros fill the literal parameters of the pool's share, `_team_share`)

Only where futexes exist (Linux on x86-64 or Arm64): `SUPPORTED`; elsewhere the pool keeps its
parallel regions.
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import weakref

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from strata.cpu.clock import tick_hz
from strata.cpu.kernels.simd import (
    I32,
    I64,
    _elem_ptr,
    atomic_add,
    atomic_load,
    cpu_relax,
    cycle_counter,
    os_yield,
)

# the control block's slots, a cache line (8 int64) each
GEN, FN, JOB, NT, DONE, SLEEPERS, STOP, READY = (8 * k for k in range(8))
CTL_LEN = 64
SPIN_PAUSE = 2048  # pause-spins before a waiting member starts yielding its core each check
SLEEP_NS = 100_000_000  # a sleeping member looks again at least this often (a lost wake is slow,
# never a hang)
DEFAULT_SPIN_US = 4000  # a member spins this long after its last job before it sleeps

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    platform.machine().lower()
)
SUPPORTED = sys.platform.startswith("linux") and _SYS_FUTEX is not None
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129


def _syscall(builder, args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(I64, [I64], var_arg=True), "syscall"
    )
    return builder.call(fn, args)


@intrinsic
def futex_wait(typingctx, arr, i, val):
    """Sleep while the low 32 bits of int64 arr[i] equal val (Linux FUTEX_WAIT, at most
    SLEEP_NS); returns at once where futexes are not `SUPPORTED`."""
    sig = types.int64(arr, types.intp, types.int64)

    def codegen(context, builder, sg, args):
        if not SUPPORTED:
            return ir.Constant(I64, 0)
        p = _elem_ptr(context, builder, sg.args[0], args[0], args[1])
        ts_t = ir.LiteralStructType([I64, I64])
        ts = cgutils.alloca_once(builder, ts_t)
        builder.store(ir.Constant(ts_t, [SLEEP_NS // 10**9, SLEEP_NS % 10**9]), ts)
        v32 = builder.zext(builder.trunc(args[2], I32), I64)  # syscall reads longs
        return _syscall(
            builder,
            [
                ir.Constant(I64, _SYS_FUTEX),
                builder.ptrtoint(p, I64),
                ir.Constant(I64, FUTEX_WAIT_PRIVATE),
                v32,
                builder.ptrtoint(ts, I64),
                ir.Constant(I64, 0),
                ir.Constant(I64, 0),
            ],
        )

    return sig, codegen


@intrinsic
def futex_wake(typingctx, arr, i):
    """Wake every thread sleeping in `futex_wait` on arr[i] (nothing where not SUPPORTED)."""
    sig = types.int64(arr, types.intp)

    def codegen(context, builder, sg, args):
        if not SUPPORTED:
            return ir.Constant(I64, 0)
        p = _elem_ptr(context, builder, sg.args[0], args[0], args[1])
        return _syscall(
            builder,
            [
                ir.Constant(I64, _SYS_FUTEX),
                builder.ptrtoint(p, I64),
                ir.Constant(I64, FUTEX_WAKE_PRIVATE),
                ir.Constant(I64, 2**31 - 1),
            ],
        )

    return sig, codegen


@intrinsic
def call_job(typingctx, fn, tid, nt, job):
    """fn(tid, nt, job, 0, 0, 0) for a native int64 function at address fn."""
    sig = types.int64(types.int64, types.int64, types.int64, types.int64)

    def codegen(context, builder, sg, args):
        fnty = ir.FunctionType(I64, [I64] * 6)
        p = builder.inttoptr(args[0], fnty.as_pointer())
        zero = ir.Constant(I64, 0)
        return builder.call(p, [args[1], args[2], args[3], zero, zero, zero])

    return sig, codegen


@intrinsic
def address(typingctx, addr):
    """An int64 address as a void pointer (for `numba.carray`)."""
    sig = types.voidptr(types.int64)

    def codegen(context, builder, sg, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


@njit(nogil=True, cache=True)
def _member(tid, ctl, spin_ticks):
    """Member tid's life: run each published job's share, then count DONE up; spin (pause, then
    yield) for spin_ticks after a job, then sleep on the generation word; return at STOP."""
    seen = atomic_load(ctl, GEN)
    atomic_add(ctl, READY, 1)
    last = cycle_counter()
    spins = 0
    while True:
        g = atomic_load(ctl, GEN)
        if g != seen:
            seen = g
            if atomic_load(ctl, STOP) != 0:
                return 0
            call_job(ctl[FN], tid, ctl[NT], ctl[JOB])
            atomic_add(ctl, DONE, 1)
            spins = 0
            last = cycle_counter()
            continue
        spins += 1
        if spins < SPIN_PAUSE:
            cpu_relax()
        elif cycle_counter() - last < spin_ticks:
            os_yield()
        else:
            atomic_add(ctl, SLEEPERS, 1)  # announce, then look once more (the caller bumps
            if atomic_load(ctl, GEN) == seen:  # GEN, then reads SLEEPERS: one sees the other)
                futex_wait(ctl, GEN, seen)
            atomic_add(ctl, SLEEPERS, -1)
            spins = 0
            last = cycle_counter()


@njit(nogil=True, cache=True, inline="always")
def team_go(ctl, fn, job, nt):
    """Publish job (fn, job) to the members 1..nt-1; returns the DONE count that `team_join`
    waits for. The caller runs share 0 in between."""
    ctl[FN] = fn
    ctl[JOB] = job
    ctl[NT] = nt
    target = atomic_load(ctl, DONE) + nt - 1
    atomic_add(ctl, GEN, 1)  # seq_cst: the stores above are seen by whoever sees the new GEN
    if atomic_load(ctl, SLEEPERS) > 0:
        futex_wake(ctl, GEN)
    return target


@njit(nogil=True, cache=True, inline="always")
def team_join(ctl, target):
    """Wait until every member has finished its share of the job `team_go` published."""
    spins = 0
    while atomic_load(ctl, DONE) < target:
        spins += 1
        if spins < SPIN_PAUSE:
            cpu_relax()
        else:
            os_yield()


@njit(nogil=True, cache=True)
def _stop(ctl):
    ctl[STOP] = 1
    atomic_add(ctl, GEN, 1)
    futex_wake(ctl, GEN)


def _close(ctl: np.ndarray, threads: list) -> None:
    _stop(ctl)
    for t in threads:
        t.join(timeout=5.0)


_SHARED: dict[int, Team] = {}
_SHARED_LOCK = threading.Lock()


def shared_team(n: int) -> Team:
    """The process's team of n threads (started on first use, again after a fork). Pools of
    one size share it (two teams would spin against each other for the same cores); a caller
    holds `team.lock` while its job runs."""
    with _SHARED_LOCK:
        team = _SHARED.get(n)
        if team is None or not team.alive():
            team = _SHARED[n] = Team(n)
        return team


class Team:
    """n - 1 member threads (ids 1..n-1; the caller is 0) parked in `_member` until `close()`
    (or the Team is collected). `ctl` is the control block `team_go` / `team_join` take; `lock`
    is held by whoever is running a job on it."""

    def __init__(self, n: int, spin_us: float = DEFAULT_SPIN_US):
        if not SUPPORTED:
            raise RuntimeError(f"no resident team on {sys.platform}/{platform.machine()}")
        if n < 2:
            raise ValueError(f"a team needs at least 2 threads, got {n}")
        self.n = n
        self.pid = os.getpid()
        self.ctl = np.zeros(CTL_LEN, np.int64)
        self.lock = threading.Lock()
        ticks = int(max(0.0, spin_us) * 1e-6 * tick_hz())
        self._threads = [
            threading.Thread(
                target=_member,
                args=(t, self.ctl, ticks),
                name=f"strata-pool-{t}",
                daemon=True,
            )
            for t in range(1, n)
        ]
        for t in self._threads:
            t.start()
        self._finalizer = weakref.finalize(self, _close, self.ctl, self._threads)
        _wait_ready(self.ctl, n - 1)

    def alive(self) -> bool:
        """Running in this process (threads do not survive a fork)."""
        return self._finalizer.alive and self.pid == os.getpid()

    def close(self) -> None:
        self._finalizer()


@njit(nogil=True, cache=True)
def _wait_ready(ctl, n):
    while atomic_load(ctl, READY) < n:
        os_yield()
