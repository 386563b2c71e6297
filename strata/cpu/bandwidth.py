"""Host read bandwidth, measured the way the pool reads: a parallel STREAM-like sum in Numba.

The pool's target is a fraction of this number, so it is measured in the same process, with the
same threads, right before or after the pool runs (machines drift; a figure from another day
says little).
"""

from __future__ import annotations

import os
import time

import numba
import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True)
def _read(buf, nt, acc):
    n = buf.shape[0]
    for t in prange(nt):
        s = np.uint64(0)
        for i in range(t * n // nt, (t + 1) * n // nt):
            s += buf[i]
        acc[t] = s


def llc_bytes() -> int:
    """The largest CPU cache on this machine (bytes), 32 MiB where the OS does not say."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in os.listdir(base):
            try:
                with open(os.path.join(base, d, "size")) as f:
                    s = f.read().strip()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
            best = max(best, int(s.rstrip("KMG")) * mult)
    except OSError:
        pass
    return best or 32 << 20


def host_read_bandwidth(n_threads: int, nbytes: int | None = None, repeats: int = 5) -> dict:
    """Read a buffer much larger than the last-level cache with `n_threads` threads.

    Returns {"gbps": median GB/s, "best_gbps": best GB/s, "bytes": buffer size, "threads": n}.
    """
    nbytes = nbytes or max(8 * llc_bytes(), 256 << 20)
    buf = np.ones(nbytes // 8, np.uint64)  # written once, so every page is really there
    acc = np.zeros(n_threads, np.uint64)
    prev = numba.get_num_threads()
    numba.set_num_threads(n_threads)
    try:
        _read(buf, n_threads, acc)  # compile, and fault in the TLB
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _read(buf, n_threads, acc)
            times.append(time.perf_counter() - t0)
    finally:
        numba.set_num_threads(prev)
    return {
        "gbps": buf.nbytes / float(np.median(times)) / 1e9,
        "best_gbps": buf.nbytes / min(times) / 1e9,
        "bytes": int(buf.nbytes),
        "threads": n_threads,
    }
