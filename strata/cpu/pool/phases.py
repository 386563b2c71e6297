"""Phases 2 and 4 (gate/up with the activation, down with the weighted sum) and the fused region's
per-thread body that runs all four with a barrier between them."""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from strata.cpu.kernels.dispatch import dot, dotn
from strata.cpu.kernels.simd import (
    atomic_add,
    cycle_counter,
)
from strata.cpu.kernels.tile import TILE, stack_buffer
from strata.cpu.pool.quant import _quant_share, _quant_x
from strata.cpu.pool.schedule import (
    DN_CTR,
    GU_CTR,
    PREFETCH_ROWS,
    _ahead_row,
    _barrier,
    _prefetch,
    _this_and_next,
    _unit_rows,
)
from strata.cpu.pool.weights import GLU_SWIGLU_OAI


@njit(cache=True, inline="always")
def _act(e, r, g, u, eb):
    """The expert activation of gate g and up u at row r of expert e. eb = (gate bias [E, F],
    up bias [E, F], down bias [E, D], glu): biases ([0, 0]: none) and the activation (GLU_SILU:
    silu(g) * u; GLU_SWIGLU_OAI: gpt-oss's, min(g, 7) sigmoid(1.702 min(g, 7)) (clip(u, 7) + 1))."""
    gb, ub, _, glu = eb
    if gb.shape[0]:
        g += gb[e, r]
        u += ub[e, r]
    if glu == GLU_SWIGLU_OAI:
        x = min(g, np.float32(7.0))
        y = min(max(u, np.float32(-7.0)), np.float32(7.0))
        return x / (np.float32(1.0) + np.exp(np.float32(1.702) * -x)) * (y + np.float32(1.0))
    return g / (np.float32(1.0) + np.exp(-g)) * u


@njit(cache=True, inline="always")
def _down_bias(e, r, y, eb):
    """y plus expert e's down bias at output row r, where the layer has one."""
    db = eb[2]
    if db.shape[0]:
        return y + db[e, r]
    return y


@njit(cache=True)
def _gate_up_rows(
    e, r0, r1, ne, n0, n1, f, tok, order, start, cnt, gk, gw, actg, uk, uw, actu, h, ahead, eb
):  # fmt: skip
    """Rows r0..r1 of expert e's gate and up for each of its tokens, SiLU(gate) * up into h.
    Rows are prefetched `ahead` rows ahead; past r1 the prefetch runs on into the run that
    comes next (expert ne's rows n0..n1; ne < 0: none)."""
    if cnt[e] - start[e] > 1:
        _gate_up_tiled(
            e, r0, r1, ne, n0, n1, f, tok, order, start, cnt, gk, gw, actg, uk, uw, actu, h, ahead,
            eb,
        )  # fmt: skip
        return
    for r in range(r0, r1):
        wr = e * f + r
        pr = _ahead_row(e, r, r1, ne, n0, n1, f, ahead)
        if pr >= 0:
            _prefetch(gw, pr)
            _prefetch(uw, pr)
        for p in range(start[e], cnt[e]):
            t = np.int64(tok[order[p]])  # (one `dot` specialization: act rows as int64)
            g = dot(gk, gw, wr, actg[0], actg[1], actg[2], actg[3], actg[4], t)
            u = dot(uk, uw, wr, actu[0], actu[1], actu[2], actu[3], actu[4], t)
            h[p, r] = _act(e, r, g, u, eb)


@njit(cache=True)
def _gate_up_tiled(
    e, r0, r1, ne, n0, n1, f, tok, order, start, cnt, gk, gw, actg, uk, uw, actu, h, ahead, eb
):  # fmt: skip
    """`_gate_up_rows` for an expert of several tokens: TILE of them a `dotn` call (each gate
    and up row decoded once for the tile), the same bits."""
    rows = numba.carray(stack_buffer(np.int64(0)), (TILE,))
    gt = numba.carray(stack_buffer(np.float32(0)), (TILE,))
    ut = numba.carray(stack_buffer(np.float32(0)), (TILE,))
    for p0 in range(start[e], cnt[e], TILE):
        n = min(TILE, cnt[e] - p0)
        for i in range(n):
            rows[i] = tok[order[p0 + i]]
        for r in range(r0, r1):
            wr = e * f + r
            if p0 == start[e]:
                pr = _ahead_row(e, r, r1, ne, n0, n1, f, ahead)
                if pr >= 0:
                    _prefetch(gw, pr)
                    _prefetch(uw, pr)
            dotn(gk, gw, wr, actg[0], actg[1], actg[2], actg[3], actg[4], rows, n, gt)
            dotn(uk, uw, wr, actu[0], actu[1], actu[2], actu[3], actu[4], rows, n, ut)
            for i in range(n):
                h[p0 + i, r] = _act(e, r, gt[i], ut[i], eb)


@njit(cache=True)
def _gate_up_share(
    tid, nt, na, f, tok, order, start, cnt, active, gk, gw, actg, uk, uw, actu, h, pf, eb
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
                ahead, eb,
            )  # fmt: skip
        pos += span


@njit(cache=True)
def _gate_up_dyn(
    tid, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
    gk, gw, actg, uk, uw, actu, h, pf, eb,
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
            h, ahead, eb,
        )  # fmt: skip
        u = nxt


@njit(cache=True)
def _gate_up_phase(
    tid, nt, dyn, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
    gk, gw, actg, uk, uw, actu, h, pf, eb,
):  # fmt: skip
    if dyn:
        _gate_up_dyn(
            tid, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
            gk, gw, actg, uk, uw, actu, h, pf, eb,
        )  # fmt: skip
    else:
        _gate_up_share(
            tid, nt, na, f, tok, order, start, cnt, active, gk, gw, actg, uk, uw, actu, h, pf, eb
        )


@njit(cache=True, inline="always")
def _down_tile(dk, dw, wr, p0, n, acth, rows, yt):
    """yt[i] = down row wr on task p0 + i's quantized intermediate, i < n (one `dotn`)."""
    for i in range(n):
        rows[i] = p0 + i
    dotn(dk, dw, wr, acth[0], acth[1], acth[2], acth[3], acth[4], rows, n, yt)


@njit(cache=True)
def _down_add_tiled(dk, dw, wr, r, p_lo, p_hi, tok, wt, order, acth, out, e, eb):
    """out[tok, r] += weight x down row wr for the tasks p_lo..p_hi of one expert, in task order
    (the additions one by one makes), TILE tasks a `dotn` call."""
    rows = numba.carray(stack_buffer(np.int64(0)), (TILE,))
    yt = numba.carray(stack_buffer(np.float32(0)), (TILE,))
    for p0 in range(p_lo, p_hi, TILE):
        n = min(TILE, p_hi - p0)
        _down_tile(dk, dw, wr, p0, n, acth, rows, yt)
        for i in range(n):
            j = order[p0 + i]
            out[tok[j], r] += wt[j] * _down_bias(e, r, yt[i], eb)


@njit(cache=True)
def _down_yb_tiled(dk, dw, wr, r, p_lo, p_hi, acth, yb, e, eb):
    """yb[p, r] = down row wr for the tasks p_lo..p_hi of one expert, TILE a `dotn` call."""
    rows = numba.carray(stack_buffer(np.int64(0)), (TILE,))
    yt = numba.carray(stack_buffer(np.float32(0)), (TILE,))
    for p0 in range(p_lo, p_hi, TILE):
        n = min(TILE, p_hi - p0)
        _down_tile(dk, dw, wr, p0, n, acth, rows, yt)
        for i in range(n):
            yb[p0 + i, r] = _down_bias(e, r, yt[i], eb)


@njit(cache=True)
def _down_rows(
    r0, r1, n0, n1, na, dim, tok, wt, order, start, cnt, active, dk, dw, acth, out, ahead, eb
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
            if cnt[e] - start[e] > 1:
                _down_add_tiled(dk, dw, wr, r, start[e], cnt[e], tok, wt, order, acth, out, e, eb)
                continue
            for p in range(start[e], cnt[e]):
                j = order[p]
                y = dot(dk, dw, wr, hq, hd, hb, h8, hf, p)
                out[tok[j], r] += wt[j] * _down_bias(e, r, y, eb)


@njit(cache=True)
def _down_share(
    tid, nt, na, dim, run, tok, wt, order, start, cnt, active, dk, dw, acth, out, pf, eb
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
            acth, out, ahead, eb,
        )  # fmt: skip


@njit(cache=True)
def _down_dyn(
    tid, na, dim, run, tok, wt, order, start, cnt, active, bar, dk, dw, acth, out, pf, eb
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
            wt, order, start, cnt, active, dk, dw, acth, out, ahead, eb,
        )  # fmt: skip
        u = nxt


@njit(cache=True, inline="always")
def _down_unit(e, r0, r1, ne, n0, n1, dim, start, cnt, dk, dw, acth, yb, ahead, eb):
    """yb[p, r] for rows r0..r1 of expert e, every task p of e: the down row r on the task's
    quantized intermediate; rows prefetched `ahead` rows on (past r1: expert ne's n0..n1)."""
    hq, hd, hb, h8, hf = acth
    for r in range(r0, r1):
        wr = e * dim + r
        pr = _ahead_row(e, r, r1, ne, n0, n1, dim, ahead)
        if pr >= 0:
            _prefetch(dw, pr)
        if cnt[e] - start[e] > 1:
            _down_yb_tiled(dk, dw, wr, r, start[e], cnt[e], acth, yb, e, eb)
            continue
        for p in range(start[e], cnt[e]):
            yb[p, r] = _down_bias(e, r, dot(dk, dw, wr, hq, hd, hb, h8, hf, p), eb)


@njit(cache=True)
def _down_expert_dyn(
    tid, na, dim, start, cnt, active, dfirst, drows, bar, dk, dw, acth, yb, pf, eb
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
        _down_unit(active[ia], r0, r1, ne, n0, n1, dim, start, cnt, dk, dw, acth, yb, ahead, eb)
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
def _down_phase(
    tid, nt, dyn, na, dim, run, tok, wt, order, start, cnt, active, bar, dk, dw, acth, out,
    pf, eb,
):  # fmt: skip
    if dyn:
        _down_dyn(
            tid, na, dim, run, tok, wt, order, start, cnt, active, bar, dk, dw, acth, out, pf, eb
        )
    else:
        _down_share(
            tid, nt, na, dim, run, tok, wt, order, start, cnt, active, dk, dw, acth, out, pf, eb
        )


@njit(cache=True)
def _fused_share(
    tid, nt, q1, q3, n, f, dim, run, dyn_g, dyn_d, bx, waitpf, pf, x, tok, wt, order, start,
    cnt, active, na, ufirst, urows, dfirst, drows, yb, gw, gk, uw, uk, dw, dk, ag, actg, au, actu,
    ad, acth, h, out, bar, stats, trace, eb,
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
    one, zero = np.int64(1), np.int64(0)  # not literals: `_barrier` compiles once
    if _barrier(bar, nt, gw, uw, active, ia, one, g0, g1 - g0, f, zero) < 0:
        stats[2] = 1
        return
    tr[2] = cycle_counter()
    _gate_up_phase(
        tid, nt, dyn_g, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
        gk, gw, actg, uk, uw, actu, h, pf, eb,
    )  # fmt: skip
    tr[3] = cycle_counter()
    k = _barrier(bar, 2 * nt, dw, none, active, ja, dn, d0, d1 - d0, dim, zero)
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
            out, pf, eb,
        )  # fmt: skip
        tr[7] = tr[8] = tr[9] = cycle_counter()
        return
    _down_expert_dyn(tid, na, dim, start, cnt, active, dfirst, drows, bar, dk, dw, acth, yb, pf, eb)
    tr[7] = cycle_counter()
    if _barrier(bar, 4 * nt, dw, none, active, zero, zero, zero, zero, dim, zero) < 0:
        stats[2] = 1
        return
    tr[8] = cycle_counter()
    _down_reduce(tid, nt, na, dim, tok, wt, order, start, cnt, active, yb, out)
    tr[9] = cycle_counter()
