"""Where a T = 1 pool call's fixed time goes (outside the compiled code, the region's phases at
n = 0 and n = 8 tasks) and the pool reading a layer from a file mmap against anonymous memory.

    python bench/pool_call_overhead.py [--threads N] [--quant IQ3_XXS]

Results: bench/results/pool-call-overhead-2core-20261130.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from strata.bench.cpu_pool import _route_seq, make_layer
from strata.cpu.pool import ExpertPool


def median_us(fn, n: int = 3000) -> float:
    fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quant", default="IQ3_XXS")
    ns = ap.parse_args()
    lw = make_layer("qwen3-30b-a3b", ns.quant)
    pool = ExpertPool(ns.threads)
    d = lw.gate.cols
    rng = np.random.default_rng()
    x = rng.standard_normal((1, d)).astype(np.float32)
    out = np.zeros((1, d), np.float32)
    none = (np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32))
    pool.run_layer(x, *none, lw, out=out)
    plan = pool._plans[id(lw)]
    print(f"run_layer, n = 0: {median_us(lambda: pool.run_layer(x, *none, lw, out=out)):.2f} us")
    fn = plan[2].get((True, True, True, True))  # the region entry (the team's is keyed apart)
    if fn is not None:
        args = (x, *none, out, *plan[1], *pool._ws_args, *pool._knobs(True))
        us = median_us(lambda: fn(*args))
        print(f"compiled entry, {len(args)} arguments, n = 0: {us:.2f} us")
    for n in (0, 8):
        acc: dict[str, list[float]] = {}
        for j, (tok, ex, w) in enumerate(_route_seq(rng, 400, 1, lw.gate.n_expert, 8)):
            t0 = time.perf_counter()
            pool.run_layer(x, tok[:n], ex[:n], w[:n], lw, out=out)
            wall = (time.perf_counter() - t0) * 1e6
            if j >= 50:
                for k, v in pool.last_phases().items():
                    acc.setdefault(k, []).append(float(np.max(v)))
                acc.setdefault("wall", []).append(wall)
        med = {k: round(float(np.median(v)), 1) for k, v in acc.items()}
        print(f"n = {n}, slowest thread, us:", med)
    with tempfile.TemporaryDirectory() as tmp:  # the same bytes from a file mmap, and anonymous

        def on_file(m, name):
            p = Path(tmp) / f"{name}.bin"
            m.data.tofile(p)
            return replace(m, data=np.memmap(p, np.uint8, mode="r").reshape(m.data.shape))

        def fresh(m):
            return replace(m, data=m.data.copy())

        lm = replace(
            lw, gate=on_file(lw.gate, "g"), up=on_file(lw.up, "u"), down=on_file(lw.down, "d")
        )
        la = replace(lw, gate=fresh(lw.gate), up=fresh(lw.up), down=fresh(lw.down))
        routes = _route_seq(rng, 1064, 1, lw.gate.n_expert, 8)
        for layer in (la, lm):  # every page faulted in first
            for tok, ex, w in routes[:64]:
                pool.run_layer(x, tok, ex, w, layer, out=out)
        ts: dict[str, list[float]] = {"anonymous": [], "mmap": []}
        for j, (tok, ex, w) in enumerate(routes[64:]):
            arms = (("anonymous", la), ("mmap", lm))
            for name, layer in arms if j % 2 == 0 else arms[::-1]:
                t0 = time.perf_counter()
                pool.run_layer(x, tok, ex, w, layer, out=out)
                ts[name].append(time.perf_counter() - t0)
        print("layer from", {k: f"{np.median(v) * 1e3:.4f} ms" for k, v in ts.items()})


if __name__ == "__main__":
    main()
