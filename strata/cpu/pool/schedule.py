"""The pool's schedule: constants, phase 0 (tasks grouped by expert, work units cut), the
spin barrier and the unit lookups every phase shares."""

from __future__ import annotations

import numpy as np
from numba import njit

from strata.cpu.kernels.simd import (
    atomic_add,
    atomic_load,
    cpu_relax,
    os_yield,
    prefetch_row,
    prefetch_row_l2,
)

ERR_TOKEN, ERR_EXPERT, ERR_BARRIER = 1, 2, 3  # _run_layer returns -code (else na)
PREFETCH_ROWS = 3  # software prefetch distance: the hardware prefetcher alone left ~40% idle
PREFETCH_BYTES = 4096  # ... and at least this many bytes ahead (short rows: 294 B at F = 768)
OUT_BLOCK = 4096  # floats of output a down run keeps (16 KiB: L1-resident sums)
# dynamic schedule, work units a thread: phase 2 (gate/up) and phase 4 (down); threads that
# stream slower take fewer units (on 16 cores 5-16% faster at T = 1 than an even split)
UNITS = 16
DOWN_UNITS = 4
MIN_DOWN_UNIT = 8  # at least this many output rows a down unit
# ... and at least this many (row, token) dot pairs a gate/up unit: 1-3 missed experts at T = 1
# would otherwise make units of a few rows, slower than 48-row ones
MIN_GATE_WORK = 16
# the expert-major down (phase 4a + 4b) while its per-task outputs [N, D] f32 fit this (T = 1:
# 8 tasks x 2048 = 64 KiB; prefill batches keep the runs of every expert)
YB_BYTES = 1 << 20
GU_CTR, DN_CTR = 8, 16  # bar[] slots of the units' counters (cache lines of their own)
BAR_LEN = 24  # bar[0]: the barrier's arrivals, then those two
SPIN_BEFORE_YIELD = 256  # pause spins (~5-20 us) before a barrier yields its core
SPIN_LIMIT = 1 << 24  # barrier checks before giving up (seconds of yields): then fall back
# threading layers whose prange(nt) over nt threads runs one iteration on each thread, all at
# once (static schedule), which the in-region barrier needs; TBB may run two on one thread
FUSED_LAYERS = ("omp", "workqueue")
# the resident team from this many threads: on 16 cores a T = 1 layer is ~5% faster on it than
# on regions; on 2 cores about even, and the host tier's dense jobs and CPU-only decode step
# (strata/cpu/dense.py, strata/engine/steps/host.py) run on the team anyway: regions there
# would fight its threads for the cores and compile the pool twice (~35 s of a cold start)
TEAM_MIN_THREADS = 2


@njit(cache=True)
def _barrier(bar, target, w, w2, active, ia0, n_e, r0, m, stride, k):
    """Arrive, then wait until `target` arrivals in total (bar[0] counts up through the call);
    returns the prefetch cursor (`_wait_at`), -1 after SPIN_LIMIT checks: some thread never came
    (see FUSED_LAYERS)."""
    atomic_add(bar, 0, 1)
    return _wait_at(bar, 0, target, w, w2, active, ia0, n_e, r0, m, stride, k)


@njit(cache=True)
def _wait_at(bar, i, target, w, w2, active, ia0, n_e, r0, m, stride, k):
    """Wait until bar[i] >= target; returns the prefetch cursor, -1 after SPIN_LIMIT checks.

    While it waits the thread prefetches, one row a check, the rows it will read first after
    the wait: k = k.. of rows active[ia0 + k // m] * stride + r0 + k % m (k < n_e m) of w
    and w2, into L2 (the memory would idle while threads wait: the first unit streams in
    during it). Once every row is asked for it spins SPIN_BEFORE_YIELD times (a phase's usual
    imbalance), then yields the core on every check: on a shared machine the thread it waits
    for may be waiting for a core (a pure spin measured 20 ms per call on the busy 2-vCPU
    box)."""
    spins = 0
    nk = n_e * m
    while atomic_load(bar, i) < target:
        if k < nk:
            row = active[ia0 + k // m] * stride + r0 + k % m
            prefetch_row_l2(w, row, w.shape[1])
            if w2.shape[0] > 0:
                prefetch_row_l2(w2, row, w2.shape[1])
            k += 1
            continue
        if spins < SPIN_BEFORE_YIELD:
            cpu_relax()
        else:
            os_yield()
        spins += 1
        if spins > SPIN_LIMIT:
            return -1
    return k


@njit(cache=True, inline="always")
def _prefetch(w, r):
    """Row r of w ahead of its use, into L1 (prefetcht0)."""
    prefetch_row(w, r, w.shape[1])


@njit(cache=True, inline="always")
def _ahead_row(e, r, r1, ne, n0, n1, rows, ahead):
    """The weight row to prefetch while row r of expert e's run r..r1 is read (`rows` rows an
    expert): `ahead` rows on, past r1 on into the run that comes next (expert ne's rows n0..n1;
    ne < 0: none); -1: nothing left to prefetch."""
    ra = r + ahead
    if ra < r1:
        return e * rows + ra
    if ne >= 0 and n0 + ra - r1 < n1:
        return ne * rows + n0 + ra - r1
    return -1


@njit(cache=True, inline="always")
def _unit_rows(u, ia, ufirst, urows, f):
    """Expert slot ia' >= ia holding gate/up unit u, and the unit's rows: (ia', r0, r1)."""
    while ufirst[ia + 1] <= u:
        ia += 1
    r0 = (u - ufirst[ia]) * urows[ia]
    return ia, r0, min(f, r0 + urows[ia])


@njit(cache=True, inline="always")
def _this_and_next(u, nxt, ia, ufirst, urows, rows, na, active):
    """Unit u as (expert slot, r0, r1), and the unit taken next, nxt, as (expert, n0, n1)
    (expert -1: none), for the prefetch past r1."""
    ia, r0, r1 = _unit_rows(u, ia, ufirst, urows, rows)
    ne, n0, n1 = -1, np.int64(0), np.int64(0)
    if nxt < ufirst[na]:
        ib, n0, n1 = _unit_rows(nxt, ia, ufirst, urows, rows)
        ne = active[ib]
    return ia, r0, r1, ne, n0, n1


@njit(cache=True)
def _unit_table(n, na, rows, units, nt, start, cnt, active, ufirst, urows):
    """Units of ~equal work over the `rows` rows of every active expert (weighted by its
    tokens), about `units` a thread, at least MIN_GATE_WORK (row, token) pairs: expert slot ia
    gets units ufirst[ia].. of urows[ia] rows (see _gate_up_dyn)."""
    per = max(MIN_GATE_WORK, (n * rows + units * nt - 1) // (units * nt))
    for ia in range(na):
        n_e = cnt[active[ia]] - start[active[ia]]
        urows[ia] = max(1, min(rows, (per + n_e - 1) // n_e))
    ufirst[0] = 0
    for ia in range(na):
        ufirst[ia + 1] = ufirst[ia] + (rows + urows[ia] - 1) // urows[ia]


@njit(cache=True)
def _group(
    t_n, n, tok, ex, n_expert, f, dim, order, cnt, start, active, ufirst, urows, dfirst, drows,
    yb, bar, stats, nt, min_tasks, chunk, fused,
):  # fmt: skip
    """Phase 0 (serial): the tasks grouped by expert (ascending), ids checked, the units of the
    dynamic schedule cut and the barrier counters reset. Returns (na, q1, q3, run, dyn_g, dyn_d,
    bx); na < 0: -ERR_TOKEN / -ERR_EXPERT."""
    stats[2] = 0
    for e in range(n_expert):
        cnt[e] = 0
    for j in range(n):
        if tok[j] < 0 or tok[j] >= t_n:
            return -ERR_TOKEN, False, False, 0, False, False, False
        if ex[j] < 0 or ex[j] >= n_expert:
            return -ERR_EXPERT, False, False, 0, False, False, False
        cnt[ex[j]] += 1
    na = 0
    s = 0
    for e in range(n_expert):
        start[e] = s
        if cnt[e] > 0:
            active[na] = e
            na += 1
        s += cnt[e]
        cnt[e] = start[e]  # becomes the fill cursor, then the end of e's tasks
    for j in range(n):
        order[cnt[ex[j]]] = j
        cnt[ex[j]] += 1
    q1 = t_n >= min_tasks
    q3 = n >= min_tasks
    run = max(chunk, OUT_BLOCK // max(t_n, 1))  # down: output rows a run
    dyn_g = nt > 1
    dyn_d = nt > 1
    na = np.int64(na)  # (not a literal 0: `_unit_table` compiles once)
    if dyn_g:  # units of ~equal work, about UNITS a thread (see _gate_up_dyn)
        _unit_table(n, na, f, UNITS, nt, start, cnt, active, ufirst, urows)
    # expert-major down: the fused region, a dynamic schedule, every task's outputs in yb
    bx = fused and dyn_g and n <= yb.shape[0]
    if bx:
        _unit_table(n, na, dim, UNITS, nt, start, cnt, active, dfirst, drows)
    if dyn_d:  # about DOWN_UNITS runs of output rows a thread (see _down_dyn)
        run = min(run, max(MIN_DOWN_UNIT, dim // (DOWN_UNITS * nt)))
    bar[GU_CTR] = nt  # units 0..nt-1 are the threads' first, taken without the counter
    bar[DN_CTR] = nt
    bar[0] = 0
    return na, q1, q3, run, dyn_g, dyn_d, bx
