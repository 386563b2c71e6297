"""The CPU pool on its resident team against Numba's parallel regions, in one process.

    python bench/pool_team_ab.py [--quant IQ3_XXS] [--threads N] [--blocks 12] [--calls 24]
                                 [--json F]

One layer of the shape's experts (T = 1, K random experts a call, layer copies over twice the
LLC as in `--arm cpu-pool`), timed in blocks of `calls` calls that alternate between the arms;
between blocks the process sleeps 0.1 s, so the threads of the arm that ran last (the team's
members spin 4 ms, OpenMP's threads its spin count) are asleep and cannot take cores from the
other. The first two calls of a block are dropped (waking the threads). Reports each arm's median
microseconds and GB/s of GGUF bytes, and the ratio to the host read measured at the end.
"""

from __future__ import annotations

import argparse
import json
import time

import numba
import numpy as np

from strata.bench.cpu_pool import _route_seq, _stamp, layer_copies, make_layer
from strata.cpu.bandwidth import host_read_bandwidth
from strata.cpu.pool import ExpertPool
from strata.model.synth import SHAPES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--quant", default="IQ3_XXS")
    ap.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--calls", type=int, default=24)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args()
    s = SHAPES[ns.shape]
    lws = layer_copies(make_layer(ns.shape, ns.quant))
    pools = {
        "team": ExpertPool(ns.threads, team=True),
        "regions": ExpertPool(ns.threads, team=False),
    }
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, s["n_embd"])).astype(np.float32)
    out = np.zeros_like(x)
    routes = _route_seq(rng, ns.blocks * ns.calls, 1, s["n_expert"], s["n_expert_used"])
    for p in pools.values():
        p.run_layer(x, *routes[0], lws[0], out=out)  # compile / warm
    times: dict[str, list[float]] = {a: [] for a in pools}
    gbytes = 0
    for b in range(ns.blocks):
        for arm in list(pools) if b % 2 == 0 else list(pools)[::-1]:
            time.sleep(0.1)
            pool = pools[arm]
            for j in range(ns.calls):
                r = routes[b * ns.calls + j]
                t0 = time.perf_counter()
                pool.run_layer(x, *r, lws[j % len(lws)], out=out)
                dt = time.perf_counter() - t0
                if j >= 2:
                    times[arm].append(dt)
                    gbytes = pool.last_gguf_bytes
    time.sleep(0.1)
    host = host_read_bandwidth(ns.threads)
    res = {"quant": ns.quant, "threads": ns.threads, "calls_per_arm": len(times["team"])}
    for arm, ts in times.items():
        sec = float(np.median(ts))
        res[arm] = {
            "us": sec * 1e6,
            "p10_us": float(np.percentile(ts, 10)) * 1e6,
            "gbps_gguf": gbytes / sec / 1e9,
            "ratio_gguf": gbytes / sec / 1e9 / host["gbps"],
        }
    res["host_read_gbps"] = host["gbps"]
    res["host_read_plain_gbps"] = host["plain_gbps"]
    res["host_read_prefetch_gbps"] = host["prefetch_gbps"]
    res.update(_stamp())
    for arm in pools:
        r = res[arm]
        print(
            f"{ns.quant} {ns.threads} threads {arm:8s}: {r['us']:7.1f} us (p10 {r['p10_us']:7.1f})"
            f"  {r['gbps_gguf']:6.1f} GB/s  ratio {r['ratio_gguf']:.3f}"
        )
    print(f"host read {host['gbps']:.1f} GB/s (plain {host['plain_gbps']:.1f})")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
