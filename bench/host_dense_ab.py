"""The host tier's dense matrices dequantized to float32 against the CPU pool's kernels
(`HostTier(dense=...)`), every expert in the pool, one process, arms in the order given.

    PYTHONPATH=. python bench/host_dense_ab.py MODEL quant float quant float

Prints each arm's build time and median decode ms a token over 24 greedy steps (after 8 warm
ones: page cache, compilation). Results: bench/results/host-dense-2core-20261130.md.
"""

import gc
import sys
import time

import numpy as np

from strata.engine.forward import Engine
from strata.engine.pool_runner import PoolMissRunner
from strata.gpu.host import HostTier
from strata.model.loader import load_model

m = load_model(sys.argv[1])
a = m.args
runner = PoolMissRunner(m, progress=False)
res = {}
for dense in sys.argv[2:]:
    t0 = time.perf_counter()
    tier = HostTier(m, n_ctx=64, dense=dense)
    tb = time.perf_counter() - t0
    e = Engine(m, tier=tier, miss_runner=runner, resident=np.zeros((a.n_layer, a.n_expert), bool))
    l0 = e.forward([1, 2, 3, 4])
    tok = int(np.argmax(l0))
    for _ in range(8):
        tok = e.decode_greedy(tok)  # warm (page cache, compile)
    ts, toks = [], []
    for _ in range(24):
        t1 = time.perf_counter()
        tok = e.decode_greedy(tok)
        ts.append(time.perf_counter() - t1)
        toks.append(tok)
    print(
        f"{dense}: build {tb:.1f} s, decode median {np.median(ts) * 1e3:.1f} ms/token ({1 / np.median(ts):.2f} tok/s), tokens {toks}",
        flush=True,
    )
    del e, tier
    gc.collect()
