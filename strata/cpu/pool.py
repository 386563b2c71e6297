"""The CPU expert pool: one layer's missed experts, all three matrices, in one jitted call.

    # T = tokens, D = hidden dim, F = expert FFN dim, E = experts, N = (token, expert) tasks
    out[t] = sum_{tasks j of token t, by expert} weight[j] * down_e(silu(gate_e(x_t)) * up_e(x_t))

with the roundings of llama.cpp's CPU matmul (`HostTier.experts` is the NumPy statement of it):
x quantized once to the gate/up weights' vec_dot type, the intermediate quantized to the down
weights' vec_dot type. Phases inside the one jitted function:

    0. tasks grouped by expert (counting sort, ascending expert ids)       serial, tiny
    1. quantize x [T, D]: (row, Q8_K block) units split over threads       parallel
    2. gate + up + SiLU.up: the F rows of every active expert, weighted by parallel
       its token count, cut into units of about equal work (row
       granularity: one or two experts at T=1 still spread over all threads)
       that threads take from a shared counter (or: one contiguous run a
       thread, the static split)
    3. quantize the intermediate [N, F]: (task, block) units               parallel
       (or, STRATA_POOL_EAGER_QUANT=1, inside phase 2: the thread that
       completes a block's rows quantizes it, `_eager_quant`)
    4. down + weighted sum: runs of D rows, all active experts a run,      parallel
       taken from a second counter (or split evenly); or, for decode
       batches, expert-major (the default, fused region, dynamic schedule):
       4a. each expert's D rows in units like phase 2's, every task's      parallel
           result into yb [N, D]; a barrier;
       4b. out summed from yb by expert, D rows split evenly               parallel
       (or, STRATA_POOL_PIPELINE=1, phases 3-4 with no barrier: the
       intermediate quantized as with EAGER_QUANT, each down unit started
       once its expert's blocks are, each chunk of output rows summed by
       the thread whose unit completes it, `_down_pipe`)

The fused mode (default) runs phases 1-4 as one parallel region, one iteration per thread, with
a spin barrier (an atomic counter) between phases: a Numba parallel region costs ~3 us to launch
on 2 threads and more on 16, and a decode layer with 1-3 missed experts has only tens of us of
work. One thread runs everything without any region. The per-phase mode (STRATA_POOL_FUSED=0,
or a threading layer that may run two iterations on one thread) launches one region per phase.

Where futexes exist (Linux) the fused phases run on a resident team of threads instead of a
parallel region (`team`, env STRATA_POOL_TEAM, default on from TEAM_MIN_THREADS threads;
strata/cpu/team.py): the call's
arrays travel by address in an int64 job descriptor (`_run_team`, `_team_share`), starting work
on 16 threads takes ~0.5 us instead of ~5 (bench/results/session12-h200-20261130.md).

Phases 1 and 3 run on one thread below `quant_min_tasks` rows, or always with parallel_quant
off (STRATA_POOL_PARALLEL_QUANT=0: the sequential A/B arm). The threshold
(STRATA_POOL_QUANT_MIN_TASKS) defaults to 1 in the fused mode (its split costs no extra region)
and to 16 per phase: there a region costs ~3-5 us on the 2-core dev box and quantizing one
768-wide row ~0.8 us, so below ~13-16 rows a region costs more than it saves.

Each output element is summed by exactly one thread, in ascending expert order from zero (as
HostTier does), so results are deterministic and do not depend on the thread count. Rows are
prefetched a few rows ahead (`PREFETCH_ROWS`): measured, the hardware prefetcher alone left the
kernels at ~60% of the single-core read bandwidth. Workspaces are allocated on the first call
and when a larger shape arrives; nothing else is allocated per call, and the Python side of a
call is a few dictionary lookups (weights' arguments and the compiled entry are kept per layer).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np
from numba import literally, njit, prange
from numba.np.ufunc import parallel as _numba_parallel

from strata.cpu.clock import tick_hz
from strata.cpu.kernels.dispatch import dot, native_address, specialized
from strata.cpu.kernels.simd import (
    atomic_add,
    atomic_load,
    cpu_relax,
    cycle_counter,
    os_yield,
    prefetch_row,
    prefetch_row_l2,
)
from strata.cpu.layout import ExpertMatrix, prepare_tensor
from strata.cpu.quantize import act_unit, alloc_act, quantize_units
from strata.cpu.team import SUPPORTED as TEAM_SUPPORTED
from strata.cpu.team import address, call_job, shared_team, team_go, team_join

ERR_TOKEN, ERR_EXPERT, ERR_BARRIER = 1, 2, 3  # _run_layer returns -code (else na)


@dataclass(frozen=True)
class LayerWeights:
    gate: ExpertMatrix  # [E, F, D]
    up: ExpertMatrix  # [E, F, D]
    down: ExpertMatrix  # [E, D, F]
    expert_nbytes: int = 0
    expert_gguf_bytes: int = 0

    def __post_init__(self):
        g, u, d = self.gate, self.up, self.down
        e, f, dim = g.n_expert, g.rows, g.cols
        shapes = [(m.n_expert, m.rows, m.cols) for m in (u, d)]
        if shapes != [(e, f, dim), (e, dim, f)]:
            raise ValueError(
                f"expert shapes do not fit: gate {[e, f, dim]}, up {[u.n_expert, u.rows, u.cols]},"
                f" down {[d.n_expert, d.rows, d.cols]} (want down [E, D, F])"
            )
        mats = (g, u, d)
        # bytes the kernels read for one expert (gate + up + down), and in the GGUF encoding
        object.__setattr__(self, "expert_nbytes", sum(m.expert_nbytes for m in mats))
        object.__setattr__(self, "expert_gguf_bytes", sum(m.expert_gguf_bytes for m in mats))


def prepare_layer(gate, up, down, simd: bool | None = None) -> LayerWeights:
    """LayerWeights from three expert tensors (TensorRef-like or ExpertMatrix)."""
    return LayerWeights(*(prepare_tensor(t, simd) for t in (gate, up, down)))




PREFETCH_ROWS = 3  # software prefetch distance: the hardware prefetcher alone left ~40% idle
PREFETCH_BYTES = 4096  # ... and at least this many bytes ahead (short rows: 294 B at F = 768)
OUT_BLOCK = 4096  # floats of output a down run keeps (16 KiB: L1-resident sums)
# dynamic schedule, work units a thread: phase 2 (gate/up) and phase 4 (down); 0: the static split.
# On the H200's host (T = 1, 16 threads, bench/results/session9-h200-20261130.md) 16 gate/up units
# a thread cut the layer by 5-16% against the static split; 4 down units a thread measured the
# same as the static down split (smaller down units, 8 short runs of rows each, were slower)
UNITS = 16
DOWN_UNITS = 4
MIN_DOWN_UNIT = 8  # at least this many output rows a down unit
# ... and at least this many (row, token) dot pairs a gate/up unit: at T = 1 with the 1-3
# experts a mostly resident decode misses, 16 units a thread would be 3-9 rows (2-vCPU VM, two
# experts, 2 threads, calls interleaved: 6-row units 8-19% and 16-row units 2% slower than 48-row
# ones, bench/results/session9-h200-20261130.md; at the measured default of 8 experts on 16
# threads, 24-row units, it does not bind; not yet measured on 16 threads)
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
# the resident team by default from this many threads: on the H200's 16 cores a T = 1 layer took
# 1-9% less on it than on regions (median 5%); on the 2-vCPU dev VM, where a region starts in
# ~1 us and a layer takes ~1.5 ms, 1.4-1.9% more (bench/results/session12-h200-20261130.md)
TEAM_MIN_THREADS = 4




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


@njit(cache=True)
def _quant_share(tid, nt, src, n_rows, code, act):
    """Thread tid's contiguous share of quantizing rows 0..n_rows-1 of src, split by units
    (Q8_K super-blocks, else 32 values): one row spreads over threads too. Bit-identical to
    `quantize_row` on every row whatever the split."""
    tid, nt = np.int64(tid), np.int64(nt)  # a parfor index may arrive unsigned: keep ints
    unit = act_unit(code)
    nu = src.shape[1] // unit
    total = n_rows * nu
    lo = tid * total // nt
    hi = (tid + 1) * total // nt
    r = lo // nu if nu > 0 else n_rows
    while r < n_rows and r * nu < hi:
        u0 = max(lo, r * nu) - r * nu
        u1 = min(hi, (r + 1) * nu) - r * nu
        quantize_units(src[r], code, r, act[0], act[1], act[2], act[3], act[4], u0, u1)
        r += 1


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


@njit(cache=True)
def _gate_up_rows(
    e, r0, r1, ne, n0, n1, f, tok, order, start, cnt, gk, gw, actg, uk, uw, actu, h, ahead
):  # fmt: skip
    """Rows r0..r1 of expert e's gate and up for each of its tokens, SiLU(gate) * up into h.
    Rows are prefetched `ahead` rows ahead; past r1 the prefetch runs on into the run that
    comes next (expert ne's rows n0..n1; ne < 0: none)."""
    for r in range(r0, r1):
        wr = e * f + r
        pr = _ahead_row(e, r, r1, ne, n0, n1, f, ahead)
        if pr >= 0:
            _prefetch(gw, pr)
            _prefetch(uw, pr)
        for p in range(start[e], cnt[e]):
            t = tok[order[p]]
            g = dot(gk, gw, wr, actg[0], actg[1], actg[2], actg[3], actg[4], t)
            u = dot(uk, uw, wr, actu[0], actu[1], actu[2], actu[3], actu[4], t)
            h[p, r] = g / (np.float32(1.0) + np.exp(-g)) * u


@njit(cache=True)
def _gate_up_share(
    tid, nt, na, f, tok, order, start, cnt, active, gk, gw, actg, uk, uw, actu, h, pf
):  # fmt: skip
    """Thread tid's contiguous share of phase 2 (the static split): the F rows of every active
    expert, weighted by the expert's token count, cut into nt runs at row granularity (so a
    decode step with one or two experts still spreads over every thread, each streaming its own
    rows). Rows are prefetched `pf` bytes ahead (at least PREFETCH_ROWS rows)."""
    ahead = max(PREFETCH_ROWS, pf // gw.shape[1])
    total = 0
    for ia in range(na):
        e = active[ia]
        total += (cnt[e] - start[e]) * f
    lo = tid * total // nt
    hi = (tid + 1) * total // nt
    pos = 0
    for ia in range(na):
        e = active[ia]
        n_e = cnt[e] - start[e]
        span = n_e * f
        if pos + span > lo and pos < hi:
            # rows whose first unit (pos + r n_e) lies in [lo, hi)
            r0 = max(0, (lo - pos + n_e - 1) // n_e)
            r1 = min(f, (hi - pos + n_e - 1) // n_e)
            _gate_up_rows(
                e, r0, r1, e, r1, f, f, tok, order, start, cnt, gk, gw, actg, uk, uw, actu, h,
                ahead,
            )  # fmt: skip
        pos += span


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
def _gate_up_dyn(
    tid, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
    gk, gw, actg, uk, uw, actu, h, pf,
):  # fmt: skip
    """Phase 2 scheduled dynamically: units of `urows[ia]` rows of expert slot ia (unit ids
    ufirst[ia].., about `units` of them a thread), thread tid's first unit tid, then each next
    one taken from the shared counter bar[GU_CTR] (which starts at nt) one unit ahead, so its
    first rows are prefetched while this one runs. A thread that streams slower than another
    (a busier core, a farther memory channel) takes fewer units; each h[p, r] is still written
    by one thread with the same arithmetic, so the bits do not depend on the schedule."""
    ahead = max(PREFETCH_ROWS, pf // gw.shape[1])
    nu = ufirst[na]
    u = np.int64(tid)
    ia = 0
    while u < nu:
        nxt = atomic_add(bar, GU_CTR, 1)
        ia, r0, r1, ne, n0, n1 = _this_and_next(u, nxt, ia, ufirst, urows, f, na, active)
        _gate_up_rows(
            active[ia], r0, r1, ne, n0, n1, f, tok, order, start, cnt, gk, gw, actg, uk, uw, actu,
            h, ahead,
        )  # fmt: skip
        u = nxt




@njit(cache=True)
def _down_rows(
    r0, r1, n0, n1, na, dim, tok, wt, order, start, cnt, active, dk, dw, acth, out, ahead
):  # fmt: skip
    """Output rows r0..r1 of phase 4: zeroed, then every active expert's rows ascending, its
    tokens' weighted results added (each output element summed by this thread alone, in
    expert order). Rows are prefetched `ahead` rows ahead: past r1 into the next expert's
    rows, past the last expert's into the run n0..n1 that comes next (n0 >= n1: none)."""
    hq, hd, hb, h8, hf = acth
    t_n = out.shape[0]
    for t in range(t_n):
        for r in range(r0, r1):
            out[t, r] = 0
    for ia in range(na):  # experts outer: each expert's rows stream; sums stay in e order
        e = active[ia]
        for r in range(r0, r1):
            wr = e * dim + r
            ra = r + ahead
            if ra < r1:
                _prefetch(dw, wr + ahead)
            elif ia + 1 < na:  # the next expert's first rows of this run
                _prefetch(dw, active[ia + 1] * dim + r0 + ra - r1)
            elif n0 + ra - r1 < n1:  # the next run's first rows (first expert)
                _prefetch(dw, active[0] * dim + n0 + ra - r1)
            for p in range(start[e], cnt[e]):
                j = order[p]
                y = dot(dk, dw, wr, hq, hd, hb, h8, hf, p)
                out[tok[j], r] += wt[j] * y


@njit(cache=True)
def _down_share(
    tid, nt, na, dim, run, tok, wt, order, start, cnt, active, dk, dw, acth, out, pf
):  # fmt: skip
    """Thread tid's contiguous share of the D rows of phase 4 (the static split), every active
    expert ascending, in runs of `run` rows (outputs that stay within OUT_BLOCK floats: at T = 1
    one run, so each expert's rows stream in one piece)."""
    lo = tid * dim // nt
    hi = (tid + 1) * dim // nt
    ahead = max(PREFETCH_ROWS, pf // dw.shape[1])
    for r0 in range(lo, hi, run):
        r1 = min(hi, r0 + run)
        _down_rows(
            r0, r1, r1, min(hi, r1 + run), na, dim, tok, wt, order, start, cnt, active, dk, dw,
            acth, out, ahead,
        )  # fmt: skip


@njit(cache=True)
def _down_dyn(
    tid, na, dim, run, tok, wt, order, start, cnt, active, bar, dk, dw, acth, out, pf
):  # fmt: skip
    """Phase 4 scheduled dynamically: units of `run` output rows (every active expert), thread
    tid's first unit tid, the next ones from the shared counter bar[DN_CTR] one unit ahead (as
    `_gate_up_dyn`); each output row is still summed by one thread in expert order."""
    ahead = max(PREFETCH_ROWS, pf // dw.shape[1])
    nu = (dim + run - 1) // run
    u = np.int64(tid)
    while u < nu:
        nxt = atomic_add(bar, DN_CTR, 1)
        r0 = u * run
        n0 = nxt * run
        _down_rows(
            r0, min(dim, r0 + run), n0, min(dim, n0 + run) if nxt < nu else n0, na, dim, tok,
            wt, order, start, cnt, active, dk, dw, acth, out, ahead,
        )  # fmt: skip
        u = nxt


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


@njit(cache=True, inline="always")
def _down_unit(e, r0, r1, ne, n0, n1, dim, start, cnt, dk, dw, acth, yb, ahead):
    """yb[p, r] for rows r0..r1 of expert e, every task p of e: the down row r on the task's
    quantized intermediate; rows prefetched `ahead` rows on (past r1: expert ne's n0..n1)."""
    hq, hd, hb, h8, hf = acth
    for r in range(r0, r1):
        wr = e * dim + r
        pr = _ahead_row(e, r, r1, ne, n0, n1, dim, ahead)
        if pr >= 0:
            _prefetch(dw, pr)
        for p in range(start[e], cnt[e]):
            yb[p, r] = dot(dk, dw, wr, hq, hd, hb, h8, hf, p)


@njit(cache=True)
def _down_expert_dyn(
    tid, na, dim, start, cnt, active, dfirst, drows, bar, dk, dw, acth, yb, pf
):  # fmt: skip
    """Phase 4a of the expert-major down: units of rows of one expert (`_unit_table` over D,
    taken as `_gate_up_dyn` takes its units, from bar[DN_CTR]); yb[p, r] = the down row r of
    task p's expert on its quantized intermediate. Each expert's rows stream in long runs, as
    gate/up's do (phase 4 proper reads a run of rows of every active expert at once)."""
    ahead = max(PREFETCH_ROWS, pf // dw.shape[1])
    nu = dfirst[na]
    u = np.int64(tid)
    ia = 0
    while u < nu:
        nxt = atomic_add(bar, DN_CTR, 1)
        ia, r0, r1, ne, n0, n1 = _this_and_next(u, nxt, ia, dfirst, drows, dim, na, active)
        _down_unit(active[ia], r0, r1, ne, n0, n1, dim, start, cnt, dk, dw, acth, yb, ahead)
        u = nxt




@njit(cache=True, inline="always")
def _reduce_rows(lo, hi, na, tok, wt, order, start, cnt, active, yb, out):
    """Output rows lo..hi summed from yb: zeroed, then every task's weighted rows, experts
    ascending (the additions `_down_rows` makes, in its order)."""
    for t in range(out.shape[0]):
        for r in range(lo, hi):
            out[t, r] = 0
    for ia in range(na):
        e = active[ia]
        for p in range(start[e], cnt[e]):
            j = order[p]
            t, w = tok[j], wt[j]
            for r in range(lo, hi):
                out[t, r] += w * yb[p, r]


@njit(cache=True)
def _down_reduce(tid, nt, na, dim, tok, wt, order, start, cnt, active, yb, out):
    """Phase 4b: thread tid's share of the D output rows summed from yb (`_reduce_rows`)."""
    tid, nt = np.int64(tid), np.int64(nt)
    _reduce_rows(tid * dim // nt, (tid + 1) * dim // nt, na, tok, wt, order, start, cnt, active,
                 yb, out)  # fmt: skip


@njit(cache=True)
def _gate_up_phase(
    tid, nt, dyn, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
    gk, gw, actg, uk, uw, actu, h, pf,
):  # fmt: skip
    if dyn:
        _gate_up_dyn(
            tid, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
            gk, gw, actg, uk, uw, actu, h, pf,
        )  # fmt: skip
    else:
        _gate_up_share(
            tid, nt, na, f, tok, order, start, cnt, active, gk, gw, actg, uk, uw, actu, h, pf
        )


@njit(cache=True)
def _down_phase(
    tid, nt, dyn, na, dim, run, tok, wt, order, start, cnt, active, bar, dk, dw, acth, out,
    pf,
):  # fmt: skip
    if dyn:
        _down_dyn(
            tid, na, dim, run, tok, wt, order, start, cnt, active, bar, dk, dw, acth, out, pf
        )
    else:
        _down_share(
            tid, nt, na, dim, run, tok, wt, order, start, cnt, active, dk, dw, acth, out, pf
        )


@njit(cache=True)
def _quant_x(tid, nt, x, ag, actg, au, actu):
    _quant_share(tid, nt, x, x.shape[0], ag, actg)
    if au != ag:  # up pairs with another activation type: quantize for it too
        _quant_share(tid, nt, x, x.shape[0], au, actu)


@njit(cache=True)
def _fused_share(
    tid, nt, q1, q3, n, f, dim, run, dyn_g, dyn_d, bx, waitpf, pf, x, tok, wt, order, start,
    cnt, active, na, ufirst, urows, dfirst, drows, yb, gw, gk, uw, uk, dw, dk, ag, actg, au, actu,
    ad, acth, h, out, bar, stats, trace,
):  # fmt: skip
    """All four phases for thread tid in one parallel region, a spin barrier between phases.

    Phases 1 and 3 run on thread 0 alone when their quantization is not parallel (q1, q3).
    bx: phase 4 expert-major (`_down_expert_dyn` into yb, a barrier, `_down_reduce`).
    trace[tid] gets the cycle counter at entry and at the end of each phase and barrier
    (TRACE_STAMPS; a timestamp costs ~10 ns; without bx the last two equal "down")."""
    tid = np.int64(tid)
    tr = trace[tid]
    tr[0] = cycle_counter()
    none = gw[:0]  # no second matrix
    # what this thread reads first after each barrier (waitpf): its first gate/up unit, then its
    # first down unit's rows of every active expert (bx: of its one expert; nothing in the
    # static split)
    ia, g0, g1 = np.int64(0), np.int64(0), np.int64(0)
    if waitpf and dyn_g and tid < ufirst[na]:
        ia, g0, g1 = _unit_rows(tid, 0, ufirst, urows, f)
    ja, dn = np.int64(0), na
    d0 = min(dim, tid * run)
    d1 = min(dim, d0 + run) if waitpf and dyn_d else d0
    if bx:
        ja, dn, d0, d1 = np.int64(0), 1, np.int64(0), np.int64(0)
        if waitpf and tid < dfirst[na]:
            ja, d0, d1 = _unit_rows(tid, 0, dfirst, drows, dim)
    if q1 or tid == 0:
        _quant_x(tid if q1 else np.int64(0), nt if q1 else 1, x, ag, actg, au, actu)
    tr[1] = cycle_counter()
    if _barrier(bar, nt, gw, uw, active, ia, 1, g0, g1 - g0, f, 0) < 0:
        stats[2] = 1
        return
    tr[2] = cycle_counter()
    _gate_up_phase(
        tid, nt, dyn_g, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
        gk, gw, actg, uk, uw, actu, h, pf,
    )  # fmt: skip
    tr[3] = cycle_counter()
    k = _barrier(bar, 2 * nt, dw, none, active, ja, dn, d0, d1 - d0, dim, 0)
    if k < 0:
        stats[2] = 1
        return
    tr[4] = cycle_counter()
    if q3 or tid == 0:
        _quant_share(tid if q3 else np.int64(0), nt if q3 else 1, h, n, ad, acth)
    tr[5] = cycle_counter()
    if _barrier(bar, 3 * nt, dw, none, active, ja, dn, d0, d1 - d0, dim, k) < 0:
        stats[2] = 1
        return
    tr[6] = cycle_counter()
    if not bx:
        _down_phase(
            tid, nt, dyn_d, na, dim, run, tok, wt, order, start, cnt, active, bar, dk, dw, acth,
            out, pf,
        )  # fmt: skip
        tr[7] = tr[8] = tr[9] = cycle_counter()
        return
    _down_expert_dyn(
        tid, na, dim, start, cnt, active, dfirst, drows, bar, dk, dw, acth, yb, pf
    )
    tr[7] = cycle_counter()
    if _barrier(bar, 4 * nt, dw, none, active, 0, 0, 0, 0, dim, 0) < 0:
        stats[2] = 1
        return
    tr[8] = cycle_counter()
    _down_reduce(tid, nt, na, dim, tok, wt, order, start, cnt, active, yb, out)
    tr[9] = cycle_counter()


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


@njit(cache=True, parallel=True)
def _run_layer(
    x, tok, ex, wt, out,
    gw, gk, uw, uk, dw, dk, n_expert, ag, au, ad,
    actg, actu, acth, h, order, cnt, start, active, ufirst, urows, dfirst, drows, yb, bar, stats,
    trace, nt, min_tasks, chunk, pf, fused,
):  # fmt: skip
    literally(gk)  # one compiled specialization per kernel triple, holding only those kernels
    literally(uk)
    literally(dk)
    t_n = x.shape[0]
    n = tok.shape[0]
    f = gw.shape[0] // n_expert
    dim = dw.shape[0] // n_expert
    na, q1, q3, run, dyn_g, dyn_d, bx = _group(
        t_n, n, tok, ex, n_expert, f, dim, order, cnt, start, active, ufirst, urows, dfirst,
        drows, yb, bar, stats, nt, min_tasks, chunk, fused,
    )  # fmt: skip
    if na < 0:
        return na
    trace[nt, 0] = cycle_counter()  # the calling thread: before the region ...
    if nt == 1:  # no parallel region at all (a region of one thread still costs ~2.5 us)
        _fused_share(
            0, 1, False, False, n, f, dim, run, False, False, False, False, pf, x, tok, wt,
            order, start, cnt, active, na, ufirst, urows, dfirst, drows, yb,
            gw, gk, uw, uk, dw, dk, ag, actg, au, actu, ad, acth, h, out, bar, stats, trace,
        )  # fmt: skip
        trace[nt, 1] = cycle_counter()
        return na
    if fused:
        for tid in prange(nt):
            _fused_share(
                tid, nt, q1, q3, n, f, dim, run, dyn_g, dyn_d, bx, True, pf, x, tok, wt,
                order, start, cnt, active, na, ufirst, urows, dfirst, drows, yb,
                gw, gk, uw, uk, dw, dk, ag, actg, au, actu, ad, acth, h, out, bar, stats, trace,
            )  # fmt: skip
        trace[nt, 1] = cycle_counter()  # ... and after it (row nt: the caller's two stamps)
        return -ERR_BARRIER if stats[2] else na
    trace[nt, 1] = 0  # the per-phase mode records no phases
    # one parallel region per phase (and none for a quantization on the calling thread)
    # ---- 1. quantize x once (for up too if its weights pair with another activation type)
    if q1:
        for tid in prange(nt):
            _quant_x(tid, nt, x, ag, actg, au, actu)
    else:
        _quant_x(0, 1, x, ag, actg, au, actu)
    # ---- 2. gate, up, silu(gate) * up
    for tid in prange(nt):
        _gate_up_phase(
            tid, nt, dyn_g, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
            gk, gw, actg, uk, uw, actu, h, pf,
        )  # fmt: skip
    # ---- 3. quantize the intermediate rows (one per task, in grouped order)
    if q3:
        for tid in prange(nt):
            _quant_share(tid, nt, h, n, ad, acth)
    else:
        _quant_share(0, 1, h, n, ad, acth)
    # ---- 4. down and the weighted sum: D rows split evenly, all active experts
    for tid in prange(nt):
        _down_phase(
            tid, nt, dyn_d, na, dim, run, tok, wt, order, start, cnt, active, bar, dk, dw, acth,
            out, pf,
        )  # fmt: skip
    return na


# ---- the resident team's path (team.py): no parallel region; every array of a call travels by
# address in one int64 job descriptor that the members read (they run `_team_share` through its
# native address, which takes only integers)
J_Q1, J_Q3, J_N, J_F, J_DIM, J_RUN, J_DYNG, J_DYND, J_BX, J_PF = range(10)
J_NA, J_AG, J_AU, J_AD = range(10, 14)
_JOB_ARRAYS = ("x", "tok", "wt", "out", "gw", "uw", "dw", "order", "cnt", "start", "active")
_JOB_ARRAYS += ("ufirst", "urows", "dfirst", "drows", "yb", "h", "bar", "stats", "trace")
_JOB_ARRAYS += tuple(f"{a}{i}" for a in ("actg", "actu", "acth") for i in range(5))
_SLOT = {name: 20 + 3 * i for i, name in enumerate(_JOB_ARRAYS)}  # (address, rows, cols)
JOB_LEN = 20 + 3 * len(_JOB_ARRAYS)
A_X, A_TOK, A_WT, A_OUT = _SLOT["x"], _SLOT["tok"], _SLOT["wt"], _SLOT["out"]
A_GW, A_ORDER, A_CNT, A_START = _SLOT["gw"], _SLOT["order"], _SLOT["cnt"], _SLOT["start"]
A_ACTIVE, A_UFIRST, A_UROWS = _SLOT["active"], _SLOT["ufirst"], _SLOT["urows"]
A_DFIRST, A_DROWS, A_YB, A_H = _SLOT["dfirst"], _SLOT["drows"], _SLOT["yb"], _SLOT["h"]
A_BAR, A_STATS, A_TRACE = _SLOT["bar"], _SLOT["stats"], _SLOT["trace"]
A_ACTG, A_ACTU, A_ACTH = _SLOT["actg0"], _SLOT["actu0"], _SLOT["acth0"]
# a layer's descriptor (ExpertPool._plan): gate, up, down as (address, rows, cols), then
L_NE, L_AG, L_AU, L_AD, L_SHARE = 9, 10, 11, 12, 13  # E, act codes, `_team_share`'s address
L_NBYTES, L_GGUF = 14, 15  # bytes one expert's three matrices read, and in the GGUF encoding
L_LEN = 16


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
    for k in range(9):  # gate, up, down
        job[A_GW + k] = ldesc[k]
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


# the stamps of one thread in trace[tid] (fused mode and nt = 1): entry, then the end of each
TRACE_STAMPS = (
    "entry",
    "quant_x",
    "barrier1",
    "gate_up",
    "barrier2",
    "quant_h",
    "barrier3",
    "down",
    "barrier4",
    "reduce",
)
_LITERAL_ARGS = (6, 8, 10)  # gk, uk, dk in _run_layer's arguments
# one region per phase: below this many rows a quantization runs on the calling thread (a region
# costs ~3-5 us on 2 cores, quantizing a 768-wide row ~0.8 us); the fused region splits from 1
QUANT_MIN_TASKS = 16


class ExpertPool:
    """Runs one layer's CPU-side experts on `n_threads` Numba threads.

    run_layer(x [T, D] f32, tok [N] i32, expert [N] i32, weight [N] f32, gate, up, down) -> [T, D]

    gate/up/down are expert tensors [E, F, D] / [E, F, D] / [E, D, F]: a `LayerWeights` (from
    `prepare_layer`, passed as `gate`), three `ExpertMatrix`, or anything with
    `.qtype/.shape/.data` (prepared on first use and kept, by identity, until
    `clear_prepared()`: for repacked formats that is a RAM copy of the layer). The result is a
    view into a workspace, overwritten by the next call, unless `out` is given. One pool serves
    one calling thread at a time (the workspaces are shared).

    `fused` (default on) runs the four phases in one parallel region with a spin barrier between
    them instead of one region per phase; it needs a threading layer that runs prange(nt) one
    iteration per thread (FUSED_LAYERS: omp, workqueue) and is switched off, with a message,
    elsewhere. Both ways give the same bits. `team` (default: from TEAM_MIN_THREADS threads where
    `strata.cpu.team.SUPPORTED`) runs the fused phases on the process's resident team of
    `n_threads` (shared by pools of that size; calls from two threads take turns) instead of a
    Numba region: the same bits, no region to start.
    """

    def __init__(
        self,
        n_threads: int | None = None,
        row_chunk: int = 32,
        fused: bool = True,
        team: bool | None = None,
    ):
        limit = numba.config.NUMBA_NUM_THREADS
        n = limit if n_threads is None else int(n_threads)
        if n < 1:
            raise ValueError(f"n_threads must be >= 1, got {n}")
        if n > limit:
            print(f"strata: CPU pool capped at {limit} threads (NUMBA_NUM_THREADS), {n} asked")
            n = limit
        self.n_threads = n
        self.row_chunk = int(row_chunk)
        self.fused = bool(fused)
        if team is None:
            team = n >= TEAM_MIN_THREADS
        self.team = bool(team) and TEAM_SUPPORTED
        self._job = np.zeros(JOB_LEN, np.int64)  # the team's job descriptor
        self._team = None  # the shared team this pool last ran on
        numba.set_num_threads(n)  # launches the threading layer: its ctypes getter exists now
        # the raw getter behind numba.get_num_threads (a private name: fall back if it moves)
        self._get_threads = getattr(_numba_parallel, "_get_num_threads", numba.get_num_threads)
        self._fused_ok: bool | None = None  # known after the first parallel region ran
        self._prepared: dict[int, tuple[object, ExpertMatrix]] = {}
        self._layers: dict[tuple, tuple] = {}  # raw tensor ids -> (tensors, LayerWeights)
        self._ws: dict[str, object] = {}
        self._ws_args: tuple = ()
        self._outs: dict[int, np.ndarray] = {}  # views of the output workspace by T
        self._stats = np.zeros(3, np.int64)
        self._bar = np.zeros(BAR_LEN, np.int64)
        # cycle-counter stamps of the last call: a row of TRACE_STAMPS a thread, then the
        # caller's (before, after); a row is 128 bytes (each thread writes its own)
        self._trace = np.zeros((limit + 1, 16), np.int64)
        self._entries: dict[tuple, object] = {}
        self._plans: dict[int, tuple] = {}  # id(LayerWeights) -> (lw, weight args, entries)
        self.last_active_experts = 0
        self.last_bytes = 0  # bytes the kernels read in the last call
        self.last_gguf_bytes = 0  # the same experts in the GGUF encoding

    # ---- weights
    def clear_prepared(self) -> None:
        """Drop the layers prepared from raw tensors (their repacked copies)."""
        self._prepared.clear()
        self._layers.clear()
        self._plans.clear()

    def _matrix(self, t) -> ExpertMatrix:
        if isinstance(t, ExpertMatrix):
            return t
        hit = self._prepared.get(id(t))
        if hit is None or hit[0] is not t:
            hit = (t, prepare_tensor(t))
            self._prepared[id(t)] = hit
        return hit[1]

    def _layer(self, gate, up, down) -> LayerWeights:
        if isinstance(gate, LayerWeights):
            return gate
        key = (id(gate), id(up), id(down))
        hit = self._layers.get(key)
        if hit is None or hit[0][0] is not gate or hit[0][1] is not up or hit[0][2] is not down:
            lw = LayerWeights(self._matrix(gate), self._matrix(up), self._matrix(down))
            hit = self._layers[key] = ((gate, up, down), lw)
        return hit[1]

    def _plan(self, lw: LayerWeights) -> tuple:
        """(lw, the weight arguments of `_run_layer`, {input flags: entry}, the team's layer
        descriptor or None) kept per layer."""
        plan = self._plans.get(id(lw))
        if plan is None or plan[0] is not lw:
            g, u, d = lw.gate, lw.up, lw.down
            wargs = (g.data, g.kernel, u.data, u.kernel, d.data, d.kernel, g.n_expert)
            wargs += (g.act, u.act, d.act)
            plan = self._plans[id(lw)] = (lw, wargs, {}, self._layer_desc(lw))
        return plan

    def _layer_desc(self, lw: LayerWeights) -> np.ndarray | None:
        """The team's descriptor of a layer (L_* slots), None where it cannot take the layer
        (no team, or weights that are not C-contiguous bytes)."""
        mats = (lw.gate, lw.up, lw.down)
        if not self.team or not self.fused or self.n_threads < 2:
            return None  # (the team runs the fused phases only: nothing to compile for it)
        if not all(m.data.flags.c_contiguous for m in mats):
            return None
        desc = np.zeros(L_LEN, np.int64)
        for i, m in enumerate(mats):
            desc[3 * i : 3 * i + 3] = (m.data.ctypes.data, *m.data.shape)
        desc[L_NE], desc[L_AG], desc[L_AU], desc[L_AD] = lw.gate.n_expert, *(m.act for m in mats)
        desc[L_SHARE] = _share_address(lw.gate.kernel, lw.up.kernel, lw.down.kernel)
        desc[L_NBYTES], desc[L_GGUF] = lw.expert_nbytes, lw.expert_gguf_bytes
        return desc

    # ---- workspaces
    def _workspace(self, t_n: int, n: int, dim: int, f: int, n_expert: int, acts) -> None:
        ws = self._ws
        key = (dim, f, n_expert, acts)
        if ws.get("key") != key or ws["t_cap"] < t_n or ws["n_cap"] < n:
            t_cap = max(t_n, 2 * ws.get("t_cap", 0) if ws.get("key") == key else t_n, 1)
            n_cap = max(n, 2 * ws.get("n_cap", 0) if ws.get("key") == key else n, 1)
            ag, au, _ = acts
            actg = alloc_act(t_cap, dim)
            ws.update(
                key=key,
                t_cap=t_cap,
                n_cap=n_cap,
                actg=actg,
                actu=actg if au == ag else alloc_act(t_cap, dim),
                acth=alloc_act(n_cap, f),
                h=np.zeros((n_cap, f), np.float32),
                order=np.zeros(n_cap, np.int32),
                cnt=np.zeros(n_expert, np.int64),
                start=np.zeros(n_expert, np.int64),
                active=np.zeros(n_expert, np.int64),
                ufirst=np.zeros(n_expert + 1, np.int64),
                urows=np.zeros(n_expert, np.int64),
                dfirst=np.zeros(n_expert + 1, np.int64),
                drows=np.zeros(n_expert, np.int64),
                # the expert-major down's outputs a task (small decode batches only)
                yb=np.zeros((min(n_cap, max(1, YB_BYTES // (4 * dim))), dim), np.float32),
                out=np.zeros((t_cap, dim), np.float32),
            )
            # barrier and unit counters, the eager quantization's block counters, the pipeline's
            self._bar = np.zeros(BAR_LEN, np.int64)
            names = ("actg", "actu", "acth", "h", "order", "cnt", "start", "active")
            names += ("ufirst", "urows", "dfirst", "drows", "yb")
            self._ws_args = (*(ws[k] for k in names), self._bar, self._stats, self._trace)
            self._outs = {}
            arrays = dict(zip(names, self._ws_args[: len(names)], strict=True))
            arrays.update(bar=self._bar, stats=self._stats, trace=self._trace)
            for a in ("actg", "actu", "acth"):
                arrays.update({f"{a}{i}": v for i, v in enumerate(arrays.pop(a))})
            for name, v in arrays.items():
                k = _SLOT[name]
                self._job[k : k + 3] = (v.ctypes.data, v.shape[0], v.shape[-1])

    def _entry(self, args, lw: LayerWeights):
        """The compiled specialization for these kernels, called without Numba's dispatch.

        `_run_layer` takes the kernel codes as literals; through the dispatcher every call
        would first try (and fail) to type a non-literal version, costing milliseconds.
        """
        key = (
            lw.gate.type_key,
            lw.up.type_key,
            lw.down.type_key,
            tuple(a.flags.writeable for a in args[:5]),
        )  # read-only inputs type differently
        fn = self._entries.get(key)
        if fn is None:
            fn = self._entries[key] = specialized(_run_layer, args, _LITERAL_ARGS)
        return fn

    def _knobs(self, fused: bool) -> tuple:
        # in the fused region a parallel quantization costs no extra region
        min_tasks = 1 if fused else QUANT_MIN_TASKS
        return (self.n_threads, min_tasks, self.row_chunk, PREFETCH_BYTES, fused)

    # ---- where the last call's time went
    def last_phases(self) -> dict[str, np.ndarray] | None:
        """Microseconds each thread spent in each phase of the last call ([n_threads] arrays:
        "start" from the caller's stamp to the thread's entry, the TRACE_STAMPS phases and
        barrier waits, "join" from the thread's end to the caller's), and "total" (the
        caller's two stamps, one value); None after a call in the per-phase mode."""
        nt = self.n_threads
        tr = self._trace
        c0, c1 = tr[nt, 0], tr[nt, 1]
        if c1 == 0 or c1 < c0:
            return None
        us = 1e6 / tick_hz()
        st = tr[:nt, : len(TRACE_STAMPS)].astype(np.float64)
        out = {"start": (st[:, 0] - c0) * us}
        for i in range(1, len(TRACE_STAMPS)):
            out[TRACE_STAMPS[i]] = (st[:, i] - st[:, i - 1]) * us
        out["join"] = (c1 - st[:, -1]) * us
        out["total"] = np.array([(c1 - c0) * us])
        return out

    # ---- the call
    def run_layer(self, x, tok, expert, weight, gate, up=None, down=None, out=None) -> np.ndarray:
        lw = gate if type(gate) is LayerWeights else self._layer(gate, up, down)
        plan = self._plans.get(id(lw))
        if plan is None or plan[0] is not lw:
            plan = self._plan(lw)
        x, weight = _c_array(x, _F32), _c_array(weight, _F32)
        tok, expert = _c_array(tok, _I32), _c_array(expert, _I32)
        if x.ndim != 2:
            raise ValueError(f"x must be [T, D], got shape {list(x.shape)}")
        t_n, dim = x.shape
        n = tok.shape[0]
        g = lw.gate
        if dim != g.cols:
            raise ValueError(f"x has {dim} columns, the experts take {g.cols}")
        if expert.shape[0] != n or weight.shape[0] != n:
            raise ValueError(
                f"tok, expert, weight lengths differ: {n}, {expert.shape[0]}, {weight.shape[0]}"
            )
        ws = self._ws
        if ws.get("ws_lw") is not lw or ws["t_cap"] < t_n or ws["n_cap"] < n:
            u, d = lw.up, lw.down
            self._workspace(t_n, n, dim, g.rows, g.n_expert, (g.act, u.act, d.act))
            ws["ws_lw"] = lw
        if out is None:
            out = self._outs.get(t_n)
            if out is None:
                out = self._outs[t_n] = ws["out"][:t_n]
        elif (
            type(out) is not np.ndarray
            or out.shape != (t_n, dim)
            or out.dtype != np.float32
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise ValueError(f"out must be a writable C-contiguous float32 array {(t_n, dim)}")
        flags = (x.flags.writeable, tok.flags.writeable, expert.flags.writeable)
        flags += (weight.flags.writeable,)
        if plan[3] is not None and self.team and self.fused:
            na = self._run_team(plan, flags, x, tok, expert, weight, out)
            if na != -ERR_BARRIER:
                return self._finish(na, lw, t_n, out)
            self.team = False  # a member never came: regions from now on (same bits)
            print(
                "strata: CPU pool team timed out at a barrier; using parallel regions from now on"
            )
        fused = self.fused and self._fused_ok is not False
        if self._fused_ok is None:
            fused = False  # learn the threading layer from a plain call first
        if self._get_threads() != self.n_threads:  # 0.6 us; numba.set_num_threads costs 1.4
            numba.set_num_threads(self.n_threads)
        fn = plan[2].get(flags)
        knobs = self._knobs(fused)
        args = (x, tok, expert, weight, out, *plan[1], *self._ws_args, *knobs)
        if fn is None:
            fn = plan[2][flags] = self._entry(args, lw)
        na = fn(*args)
        if self._fused_ok is None:
            layer = _threading_layer()
            if layer != "?":
                self._fused_ok = layer in FUSED_LAYERS
        elif na == -ERR_BARRIER:  # a barrier timed out: never again on this pool (same bits)
            self._fused_ok = False
            print(
                f"strata: CPU pool barrier timed out under the {_threading_layer()!r} threading"
                " layer; running one parallel region per phase from now on"
            )
            na = fn(*args[: -len(knobs)], *self._knobs(False))
        return self._finish(na, lw, t_n, out)

    def _run_team(self, plan, flags, x, tok, expert, weight, out) -> int:
        """The call on the process's resident team of this size (`_run_team`, `shared_team`)."""
        team = self.team_now()
        fn = self._entries.get(("team", flags))
        args = (x, tok, expert, weight, out, plan[3], self._job, team.ctl, *self.team_knobs())
        if fn is None:
            fn = self._entries[("team", flags)] = specialized(_run_team, args, ())
        with team.lock:
            return fn(*args)

    def team_now(self):
        """The resident team this pool runs on (started, or started again after a fork)."""
        team = self._team
        if team is None or not team.alive():
            team = self._team = shared_team(self.n_threads)
        return team

    def team_knobs(self) -> tuple:
        """`_run_team`'s arguments after ctl: the thread count and the schedule's knobs (not
        `fused`: the team runs the fused phases)."""
        return self._knobs(True)[:-1]

    def _finish(self, na: int, lw: LayerWeights, t_n: int, out: np.ndarray) -> np.ndarray:
        if na < 0:
            if na == -ERR_TOKEN:
                raise ValueError(f"a token index is outside 0..{t_n - 1}")
            raise ValueError(f"an expert id is outside 0..{lw.gate.n_expert - 1}")
        self.last_active_experts = na
        self.last_bytes = na * lw.expert_nbytes
        self.last_gguf_bytes = na * lw.expert_gguf_bytes
        return out


_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)


def _c_array(a, dt: np.dtype) -> np.ndarray:
    """a as a C-contiguous array of dtype dt: a itself when it already is one (the common case,
    checked without entering np.ascontiguousarray)."""
    if type(a) is np.ndarray and a.dtype is dt and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=dt)






def _threading_layer() -> str:
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel region has run yet (a one-thread pool, or no tasks)
        return "?"
