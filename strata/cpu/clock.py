"""The cycle counter's rate: converts the pool's phase stamps and the team's spin budget."""

from __future__ import annotations

import functools
import time

from numba import njit

from strata.cpu.kernels.simd import cycle_counter


@njit(cache=True)
def _ticks() -> int:
    return cycle_counter()


@functools.cache
def tick_hz() -> float:
    """Ticks a second of `cycle_counter` (measured once against perf_counter over ~20 ms; the
    x86 TSC and Arm's virtual counter run at a constant rate)."""
    _ticks()  # compiled before the first stamp
    t0, c0 = time.perf_counter(), _ticks()
    time.sleep(0.02)
    t1, c1 = time.perf_counter(), _ticks()
    return (c1 - c0) / (t1 - t0)
