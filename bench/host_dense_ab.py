"""The host tier's dense matrices dequantized to float32 against the CPU pool's kernels
(`HostTier(dense=...)`), every expert in the pool, one process, arms in the order given.

    PYTHONPATH=. python bench/host_dense_ab.py MODEL quant float quant float

Prints each arm's build time and median decode ms a token over 24 greedy steps (after 8 warm
ones: page cache, compilation). Results: bench/results/host-dense-2core-20261130.md.
"""

from __future__ import annotations

import gc
import sys
import time

import numpy as np

from strata.engine.forward import Engine
from strata.engine.pool_runner import PoolMissRunner
from strata.gpu.host import HostTier
from strata.model.loader import load_model


def main() -> None:
    model = load_model(sys.argv[1])
    a = model.args
    runner = PoolMissRunner(model, progress=False)
    none = np.zeros((a.n_layer, a.n_expert), bool)  # every expert in the pool
    for dense in sys.argv[2:]:
        t0 = time.perf_counter()
        tier = HostTier(model, n_ctx=64, dense=dense)
        build = time.perf_counter() - t0
        engine = Engine(model, tier=tier, miss_runner=runner, resident=none)
        tok = int(np.argmax(engine.forward([1, 2, 3, 4])))
        for _ in range(8):  # warm: page cache, compilation
            tok = engine.decode_greedy(tok)
        ts, toks = [], []
        for _ in range(24):
            t1 = time.perf_counter()
            tok = engine.decode_greedy(tok)
            ts.append(time.perf_counter() - t1)
            toks.append(tok)
        ms = 1e3 * float(np.median(ts))
        print(f"{dense}: build {build:.1f} s, decode {ms:.1f} ms a token, tokens {toks[:6]}")
        del engine, tier
        gc.collect()


if __name__ == "__main__":
    main()
