"""Host read bandwidth, measured the way the pool reads: a parallel STREAM-like sum in Numba.

The pool's target is a fraction of this number, so it is measured in the same process, with the
same threads, right before or after the pool runs (machines drift; a figure from another day
says little). Two reads, interleaved: a plain sum (the hardware prefetcher alone) and one that
software-prefetches each 4 KiB a page ahead as the pool does; the figure is the faster one's
median, so the pool is never measured against a read slower than its own way of reading.
"""

from __future__ import annotations

import os
import time

import numba
import numpy as np
from numba import njit, prange

from strata.cpu.kernels.simd import prefetch_row

ROW = 512  # uint64 a row of the prefetching read: 4 KiB


@njit(cache=True, parallel=True)
def _read(buf, nt, acc):
    n = buf.shape[0]
    for t in prange(nt):
        s = np.uint64(0)
        for i in range(t * n // nt, (t + 1) * n // nt):
            s += buf[i]
        acc[t] = s


@njit(cache=True, parallel=True)
def _read_pf(rows, nt, acc):
    """The same sum over rows [n, ROW], row r + 1 software-prefetched while r is summed."""
    n = rows.shape[0]
    for t in prange(nt):
        s = np.uint64(0)
        r1 = (t + 1) * n // nt
        for r in range(t * n // nt, r1):
            if r + 1 < r1:
                prefetch_row(rows, r + 1, ROW * 8)
            for i in range(ROW):
                s += rows[r, i]
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

    Returns {"gbps": median GB/s of the faster read, "best_gbps": its best GB/s,
    "plain_gbps" / "prefetch_gbps": each read's median, "bytes": buffer size, "threads": n}.
    """
    nbytes = nbytes or max(8 * llc_bytes(), 256 << 20)
    buf = np.ones(nbytes // (8 * ROW) * ROW, np.uint64)  # written once: every page is there
    return _measure([buf], n_threads, repeats)


def read_bandwidth(arrays, n_threads: int, repeats: int = 5) -> dict:
    """The same two reads over existing C-contiguous arrays, one after another (each cut to
    whole 4 KiB rows): e.g. the pool's own weights, read from the same pages the pool reads.
    On a virtual machine two buffers of one process can sit in memory of different speed
    (89-135 GB/s between processes for the same read were seen), so the pool's figure is also
    given against a read of its own bytes."""
    bufs = []
    for a in arrays:
        b = a.reshape(-1).view(np.uint8)  # (raises for a non-contiguous array: no copy)
        n = b.nbytes // (8 * ROW) * (8 * ROW)
        if n:
            bufs.append(b[:n].view(np.uint64))
    if not bufs:
        raise ValueError("no whole 4 KiB row to read in the arrays given")
    return _measure(bufs, n_threads, repeats)


def _measure(bufs: list, n_threads: int, repeats: int) -> dict:
    rows = [b.reshape(-1, ROW) for b in bufs]
    total = sum(b.nbytes for b in bufs)
    acc = np.zeros(n_threads, np.uint64)
    prev = numba.get_num_threads()
    numba.set_num_threads(n_threads)
    times: dict[str, list[float]] = {"plain": [], "prefetch": []}
    try:
        for b, r in zip(bufs, rows, strict=True):
            _read(b, n_threads, acc)  # compile, and fault in the TLB
            _read_pf(r, n_threads, acc)
        for i in range(repeats):
            for arm in ("plain", "prefetch") if i % 2 == 0 else ("prefetch", "plain"):
                t0 = time.perf_counter()
                if arm == "plain":
                    for b in bufs:
                        _read(b, n_threads, acc)
                else:
                    for r in rows:
                        _read_pf(r, n_threads, acc)
                times[arm].append(time.perf_counter() - t0)
    finally:
        numba.set_num_threads(prev)
    med = {arm: total / float(np.median(ts)) / 1e9 for arm, ts in times.items()}
    top = max(med, key=med.get)
    return {
        "gbps": med[top],
        "best_gbps": total / min(times[top]) / 1e9,
        "plain_gbps": med["plain"],
        "prefetch_gbps": med["prefetch"],
        "bytes": int(total),
        "threads": n_threads,
    }
