"""Gate/up unit size of the CPU pool's dynamic schedule at T = 1 with few experts a token: arms of
`units` (gate/up units a thread; 0 = the static split) interleaved call by call, each call on the
next layer copy, median microseconds a layer. MIN_GATE_WORK (strata/cpu/pool.py) floors the unit
size: set it to 1 there to see units below it.

    python bench/pool_unit_size.py [--threads N] [--experts 2] [--calls 400]
"""

import argparse
import time

import numba
import numpy as np

from strata.bench.cpu_pool import _route_seq, layer_copies, make_layer
from strata.cpu import ExpertPool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    ap.add_argument("--experts", type=int, default=2, help="experts a token (missed ones)")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--units", default="0,16,48,128")
    a = ap.parse_args()
    lws = layer_copies(make_layer("qwen3-30b-a3b", "IQ3_XXS"))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2048)).astype(np.float32)
    routes = _route_seq(rng, a.calls, 1, 128, a.experts)
    units = [int(u) for u in a.units.split(",")]
    pools = {u: ExpertPool(a.threads, units=u, down_units=4 if u else 0) for u in units}
    for p in pools.values():
        p.run_layer(x, *routes[0], lws[0])
    ts = {u: [] for u in pools}
    c = 0
    for i, r in enumerate(routes):
        for u in units if i % 2 == 0 else units[::-1]:
            t0 = time.perf_counter()
            pools[u].run_layer(x, *r, lws[c % len(lws)])
            ts[u].append(time.perf_counter() - t0)
            c += 1
    f = lws[0].gate.rows
    for u in units:
        rows = f * a.experts / (u * a.threads) if u else f * a.experts / a.threads
        print(f"units {u:>4} (~{rows:.0f} rows before the floor): {np.median(ts[u]) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
