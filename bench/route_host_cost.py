"""What the host's per-layer routing costs on the decode path (T = 1), the NumPy rules of record
against their compiled twins (strata.routing), warm, median of repeats; then the miss runner's
task list and the CPU-only tier's activation round trip, NumPy against compiled.

    PYTHONPATH=. python bench/route_host_cost.py [--experts 128] [--k 8]

Results: bench/results/route-fast-2core-20261130.md.
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np

from strata.bench.common import commit
from strata.cpu.quantize import roundtrip
from strata.cpu.runner import _tasks
from strata.quant import activation as A
from strata.quant.formats import QT
from strata.routing.profile import AdaptiveCache, observe_fast
from strata.routing.topk import count_picks, route_topk, topk_fast


def median_us(fn, n: int = 4000, rounds: int = 5) -> float:
    fn()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return float(np.median(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ns = ap.parse_args()
    e, k = ns.experts, ns.k
    g = np.random.default_rng(0)
    logits = (g.standard_normal((1, e)) * 2).astype(np.float32)
    ids = route_topk(logits, k, True)[0]
    hist = np.zeros(e, np.int64)
    cache = AdaptiveCache(g.random((48, e)) < 0.7, max_swaps=768)
    twin = copy.deepcopy(cache)
    rows = [
        ("top-k", lambda: route_topk(logits, k, True), lambda: topk_fast(logits, k, True)),
        ("pick histogram", lambda: np.add.at(hist, ids.ravel(), 1), lambda: count_picks(hist, ids)),
        ("adaptive observe", lambda: cache.observe(3, ids), lambda: observe_fast(twin, 3, ids)),
    ]
    print(f"commit {commit()}, E = {e}, K = {k}, us a layer (median of 5 x 4000 calls)")
    print(f"{'step':<18} {'NumPy':>8} {'compiled':>9}")
    tot = [0.0, 0.0]
    for name, a, b in rows:
        ua, ub = median_us(a), median_us(b)
        tot[0] += ua
        tot[1] += ub
        print(f"{name:<18} {ua:>8.2f} {ub:>9.2f}")
    print(f"{'sum':<18} {tot[0]:>8.2f} {tot[1]:>9.2f}")
    # the other per-layer host steps this session compiled: the miss runner's task list
    # (strata/cpu/runner.py) and the host tier's activation round trip (one 2048 row)
    miss = np.where(g.random((1, k)) < 0.5, ids, -1)
    w = g.random((1, k)).astype(np.float32)
    bufs = (np.zeros(k, np.int32), np.zeros(k, np.int32), np.zeros(k, np.float32))
    x = g.standard_normal((1, 2048)).astype(np.float32)

    def numpy_tasks():
        tok, kk = np.nonzero(miss >= 0)
        return tok.astype(np.int32), miss[tok, kk].astype(np.int32), w[tok, kk].astype(np.float32)

    more = [
        ("miss tasks", numpy_tasks, lambda: _tasks(miss, w, *bufs)),
        ("act round trip", lambda: A.roundtrip(x, QT.Q8_K), lambda: roundtrip(x, QT.Q8_K)),
    ]
    for name, a, b in more:
        print(f"{name:<18} {median_us(a):>8.2f} {median_us(b):>9.2f}")


if __name__ == "__main__":
    main()
