"""`_run_layer`: one layer in Numba parallel regions (fused: one region; else one a phase)."""

from __future__ import annotations

from numba import literally, njit, prange

from strata.cpu.kernels.simd import (
    cycle_counter,
)
from strata.cpu.pool.phases import _down_phase, _fused_share, _gate_up_phase
from strata.cpu.pool.quant import _quant_share, _quant_x
from strata.cpu.pool.schedule import ERR_BARRIER, _group


@njit(cache=True, parallel=True)
def _run_layer(
    x, tok, ex, wt, out,
    gw, gk, uw, uk, dw, dk, n_expert, ag, au, ad, eb,
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
            gw, gk, uw, uk, dw, dk, ag, actg, au, actu, ad, acth, h, out, bar, stats, trace, eb,
        )  # fmt: skip
        trace[nt, 1] = cycle_counter()
        return na
    if fused:
        for tid in prange(nt):
            _fused_share(
                tid, nt, q1, q3, n, f, dim, run, dyn_g, dyn_d, bx, True, pf, x, tok, wt,
                order, start, cnt, active, na, ufirst, urows, dfirst, drows, yb,
                gw, gk, uw, uk, dw, dk, ag, actg, au, actu, ad, acth, h, out, bar, stats, trace, eb,
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
    # ---- 2. gate, up, the activation (silu(gate) * up, or gpt-oss's with biases)
    for tid in prange(nt):
        _gate_up_phase(
            tid, nt, dyn_g, na, f, tok, order, start, cnt, active, ufirst, urows, bar,
            gk, gw, actg, uk, uw, actu, h, pf, eb,
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
            out, pf, eb,
        )  # fmt: skip
    return na
