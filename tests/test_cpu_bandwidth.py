"""The host read bandwidth the pool is measured against: both reads sum every byte, and the
figure is the faster read's (the pool must not be compared with a read slower than its own)."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cpu.bandwidth import ROW, _read, _read_pf, host_read_bandwidth, read_bandwidth


def test_both_reads_sum_every_element():
    rng = np.random.default_rng()
    buf = rng.integers(0, 1 << 40, 37 * ROW, dtype=np.uint64)
    for nt in (1, 2, 3):
        a, b = np.zeros(nt, np.uint64), np.zeros(nt, np.uint64)
        _read(buf, nt, a)
        _read_pf(buf.reshape(-1, ROW), nt, b)
        assert a.sum() == b.sum() == buf.sum()


def test_host_read_reports_the_faster_read():
    r = host_read_bandwidth(2, nbytes=8 << 20, repeats=3)
    assert r["gbps"] == max(r["plain_gbps"], r["prefetch_gbps"]) > 0
    assert r["best_gbps"] >= r["gbps"] and r["bytes"] == 8 << 20 and r["threads"] == 2


def test_read_of_given_arrays_counts_their_whole_rows():
    rng = np.random.default_rng()
    a = rng.integers(0, 255, (300, 784), dtype=np.uint8)  # 235200 B: 57 whole 4 KiB rows
    b = rng.integers(0, 255, (2, 8192), dtype=np.uint8)  # 4 rows
    r = read_bandwidth([a, b], 2, repeats=3)
    assert r["bytes"] == (57 + 4) * 4096 and r["threads"] == 2
    assert r["gbps"] == max(r["plain_gbps"], r["prefetch_gbps"]) > 0
    with pytest.raises(ValueError, match="no whole"):
        read_bandwidth([a[:3]], 2)
    with pytest.raises(ValueError):  # a strided view is not read through a copy
        read_bandwidth([a[:, ::2]], 2)
