"""The resident team's path (team.py): no parallel region; every array of a call travels by
address in one int64 job descriptor that the members read (they run `_team_share` through its
native address, which takes only integers)."""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import literally, njit

from strata.cpu.kernels.dispatch import native_address
from strata.cpu.kernels.simd import (
    cycle_counter,
)
from strata.cpu.pool.phases import _fused_share
from strata.cpu.pool.schedule import ERR_BARRIER, _group
from strata.cpu.team import address, call_job, team_go, team_join

# ---- the resident team's path (team.py): no parallel region; every array of a call travels by
# address in one int64 job descriptor that the members read (they run `_team_share` through its
# native address, which takes only integers)
J_Q1, J_Q3, J_N, J_F, J_DIM, J_RUN, J_DYNG, J_DYND, J_BX, J_PF = range(10)


J_NA, J_AG, J_AU, J_AD, J_GLU = range(10, 15)


_JOB_ARRAYS = ("x", "tok", "wt", "out", "gw", "uw", "dw", "order", "cnt", "start", "active")


_JOB_ARRAYS += ("ufirst", "urows", "dfirst", "drows", "yb", "h", "bar", "stats", "trace")


_JOB_ARRAYS += tuple(f"{a}{i}" for a in ("actg", "actu", "acth") for i in range(5))


_JOB_ARRAYS += ("gb", "ub", "db")  # the layer's expert biases ([0, 0]: none)


_SLOT = {name: 20 + 3 * i for i, name in enumerate(_JOB_ARRAYS)}  # (address, rows, cols)


JOB_LEN = 20 + 3 * len(_JOB_ARRAYS)


A_X, A_TOK, A_WT, A_OUT = _SLOT["x"], _SLOT["tok"], _SLOT["wt"], _SLOT["out"]


A_GW, A_ORDER, A_CNT, A_START = _SLOT["gw"], _SLOT["order"], _SLOT["cnt"], _SLOT["start"]


A_ACTIVE, A_UFIRST, A_UROWS = _SLOT["active"], _SLOT["ufirst"], _SLOT["urows"]


A_DFIRST, A_DROWS, A_YB, A_H = _SLOT["dfirst"], _SLOT["drows"], _SLOT["yb"], _SLOT["h"]


A_BAR, A_STATS, A_TRACE = _SLOT["bar"], _SLOT["stats"], _SLOT["trace"]


A_ACTG, A_ACTU, A_ACTH = _SLOT["actg0"], _SLOT["actu0"], _SLOT["acth0"]


A_GB = _SLOT["gb"]  # gate, up, down biases in three consecutive slots


# a layer's descriptor (ExpertPool._plan): gate, up, down as (address, rows, cols), then
L_NE, L_AG, L_AU, L_AD, L_SHARE = 9, 10, 11, 12, 13  # E, act codes, `_team_share`'s address


L_NBYTES, L_GGUF = 14, 15  # bytes one expert's three matrices read, and in the GGUF encoding


# the expert biases as (address, rows, cols) each (LayerWeights.extras), and the activation
L_GB, L_GLU = 16, 25


L_LEN = 26


@njit(cache=True, inline="always")
def _j1(job, k, dt):
    return numba.carray(address(job[k]), (job[k + 1],), dt)


@njit(cache=True, inline="always")
def _j2(job, k, dt):
    return numba.carray(address(job[k]), (job[k + 1], job[k + 2]), dt)


@njit(cache=True, inline="always")
def _jact(job, k):
    return (
        _j2(job, k, np.int8),
        _j2(job, k + 3, np.float32),
        _j2(job, k + 6, np.int16),
        _j2(job, k + 9, np.int16),
        _j2(job, k + 12, np.float32),
    )


@njit(cache=True, inline="always")
def _put(job, k, a):
    """Array a (1-D or 2-D, C-contiguous) into slot k of the job."""
    job[k] = a.ctypes.data
    job[k + 1] = a.shape[0]
    job[k + 2] = a.shape[-1]  # (1-D: not read)


@njit(cache=True, nogil=True)
def _team_share(tid, nt, jaddr, gk, uk, dk):
    """Thread tid's `_fused_share` of the job at address jaddr (members call it natively)."""
    literally(gk)
    literally(uk)
    literally(dk)
    job = numba.carray(address(jaddr), (JOB_LEN,), np.int64)
    _fused_share(
        tid, nt, job[J_Q1] != 0, job[J_Q3] != 0, job[J_N], job[J_F], job[J_DIM], job[J_RUN],
        job[J_DYNG] != 0, job[J_DYND] != 0, job[J_BX] != 0, True, job[J_PF],
        _j2(job, A_X, np.float32), _j1(job, A_TOK, np.int32),
        _j1(job, A_WT, np.float32), _j1(job, A_ORDER, np.int32), _j1(job, A_START, np.int64),
        _j1(job, A_CNT, np.int64), _j1(job, A_ACTIVE, np.int64), job[J_NA],
        _j1(job, A_UFIRST, np.int64), _j1(job, A_UROWS, np.int64), _j1(job, A_DFIRST, np.int64),
        _j1(job, A_DROWS, np.int64), _j2(job, A_YB, np.float32),
        _j2(job, A_GW, np.uint8), gk, _j2(job, A_GW + 3, np.uint8), uk,
        _j2(job, A_GW + 6, np.uint8), dk, job[J_AG], _jact(job, A_ACTG), job[J_AU],
        _jact(job, A_ACTU), job[J_AD], _jact(job, A_ACTH), _j2(job, A_H, np.float32),
        _j2(job, A_OUT, np.float32), _j1(job, A_BAR, np.int64), _j1(job, A_STATS, np.int64),
        _j2(job, A_TRACE, np.int64),
        (_j2(job, A_GB, np.float32), _j2(job, A_GB + 3, np.float32),
         _j2(job, A_GB + 6, np.float32), job[J_GLU]),
    )  # fmt: skip
    return 0


@njit(cache=True, nogil=True)
def _run_team(
    x, tok, ex, wt, out, ldesc, job, ctl,
    nt, min_tasks, chunk, pf,
):  # fmt: skip
    """`_run_layer`'s fused mode on the resident team: phase 0 here, then the job (this call's
    arrays, the layer's weights from ldesc, the workspaces the pool put in job) published to
    the members, share 0 run here, and a wait for the members to finish. Every share, the
    caller's too, runs `_team_share` through its native address (ldesc[L_SHARE]), so one
    compiled `_run_team` serves every kernel triple (and `strata.cpu.serve`'s step loop)."""
    t_n = x.shape[0]
    n = tok.shape[0]
    n_expert = ldesc[L_NE]
    f = ldesc[1] // n_expert
    dim = ldesc[7] // n_expert
    stats = _j1(job, A_STATS, np.int64)
    trace = _j2(job, A_TRACE, np.int64)
    na, q1, q3, run, dyn_g, dyn_d, bx = _group(
        t_n, n, tok, ex, n_expert, f, dim, _j1(job, A_ORDER, np.int32),
        _j1(job, A_CNT, np.int64), _j1(job, A_START, np.int64), _j1(job, A_ACTIVE, np.int64),
        _j1(job, A_UFIRST, np.int64), _j1(job, A_UROWS, np.int64), _j1(job, A_DFIRST, np.int64),
        _j1(job, A_DROWS, np.int64), _j2(job, A_YB, np.float32), _j1(job, A_BAR, np.int64),
        stats, nt, min_tasks, chunk, True,
    )  # fmt: skip
    if na < 0:
        return na
    _put(job, A_X, x)
    _put(job, A_TOK, tok)
    _put(job, A_WT, wt)
    _put(job, A_OUT, out)
    for k in range(9):  # gate, up, down; their biases
        job[A_GW + k] = ldesc[k]
        job[A_GB + k] = ldesc[L_GB + k]
    job[J_GLU] = ldesc[L_GLU]
    job[J_Q1], job[J_Q3], job[J_N], job[J_F], job[J_DIM], job[J_RUN] = q1, q3, n, f, dim, run
    job[J_DYNG], job[J_DYND], job[J_BX], job[J_PF], job[J_NA] = dyn_g, dyn_d, bx, pf, na
    job[J_AG], job[J_AU], job[J_AD] = ldesc[L_AG], ldesc[L_AU], ldesc[L_AD]
    trace[nt, 0] = cycle_counter()  # the calling thread: before the job is published ...
    jaddr = job.ctypes.data
    target = team_go(ctl, ldesc[L_SHARE], jaddr, nt)
    call_job(ldesc[L_SHARE], 0, nt, jaddr)
    team_join(ctl, target)
    trace[nt, 1] = cycle_counter()  # ... and after every member finished
    return -ERR_BARRIER if stats[2] else na


@functools.cache
def _share_address(gk: int, uk: int, dk: int) -> int:
    """The native address of `_team_share` for this kernel triple (compiled, or from the cache)."""
    z = np.int64(0)
    return native_address(_team_share, (z, z, z, gk, uk, dk), (3, 4, 5))
