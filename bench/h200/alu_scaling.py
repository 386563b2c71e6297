"""How much compute the host's cores share: a register-only loop (no memory traffic) on 1, N/2
and N threads at once, per-thread rate against the one-thread rate.

Each thread runs 16 independent chains of scalar float multiplies and adds (enough that the
float ports' throughput, not the chains' latency, bounds one thread). Separate physical cores
keep ~1.0 of the one-thread rate when all run; two hyperthreads of one core share its ports
and get ~0.5 each; a guest's vCPUs over fewer host cores look the same. Prints a markdown
table; --json FILE writes it too.
"""

from __future__ import annotations

import argparse
import json
import time

import numba
import numpy as np
from numba import njit, prange

N_ITER = 20_000_000


@njit(cache=True)
def _chains(n, seed):
    a0, a1, a2, a3 = seed + 0.0, seed + 1.0, seed + 2.0, seed + 3.0
    a4, a5, a6, a7 = seed + 4.0, seed + 5.0, seed + 6.0, seed + 7.0
    a8, a9, a10, a11 = seed + 8.0, seed + 9.0, seed + 10.0, seed + 11.0
    a12, a13, a14, a15 = seed + 12.0, seed + 13.0, seed + 14.0, seed + 15.0
    m, c = 0.999999, 1e-7
    for _ in range(n):
        a0 = a0 * m + c
        a1 = a1 * m + c
        a2 = a2 * m + c
        a3 = a3 * m + c
        a4 = a4 * m + c
        a5 = a5 * m + c
        a6 = a6 * m + c
        a7 = a7 * m + c
        a8 = a8 * m + c
        a9 = a9 * m + c
        a10 = a10 * m + c
        a11 = a11 * m + c
        a12 = a12 * m + c
        a13 = a13 * m + c
        a14 = a14 * m + c
        a15 = a15 * m + c
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12 + a13 + a14 + a15


@njit(parallel=True, cache=True)
def _all(nt, n, out):
    for i in prange(nt):  # nt iterations on nt threads: one each
        out[i] = _chains(n, float(i))


def _per_thread_rate(nt: int, n: int) -> float:
    """Multiply-adds a second per thread with nt threads running the loop at once (best of 5)."""
    numba.set_num_threads(nt)
    out = np.zeros(nt)
    _all(nt, 1000, out)  # compile, wake the threads
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        _all(nt, n, out)
        best = min(best, time.perf_counter() - t0)
    return 16 * n / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="", help="comma list (default 1, N/2, N)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    n_max = numba.config.NUMBA_NUM_THREADS
    ts = [int(t) for t in a.threads.split(",")] if a.threads else sorted({1, n_max // 2, n_max})
    one = _per_thread_rate(1, N_ITER)
    rows = [{"threads": t, "gflop_s_per_thread": _per_thread_rate(t, N_ITER) / 1e9} for t in ts]
    print("| threads | G multiply-adds/s a thread | of one thread alone |")
    print("| ---: | ---: | ---: |")
    for r in rows:
        r["ratio"] = r["gflop_s_per_thread"] / (one / 1e9)
        print(f"| {r['threads']} | {r['gflop_s_per_thread']:.2f} | {r['ratio']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"one_thread": one / 1e9, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
