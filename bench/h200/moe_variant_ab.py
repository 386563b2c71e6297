"""The MoE decode kernel pairs (strata.gpu.experts "<gate/up>+<down>") inside one decode layer of
`strata.bench.gpu_kernels.bench_layer` (8 experts at T = 1, graph + PDL: the gpu-kernels arm's
layer figure), arms interleaved in one process (forward, then backward), best of the passes.
Usage: python3 bench/h200/moe_variant_ab.py [QUANTS] [ARMS] [PASSES]
(defaults IQ3_XXS,Q4_K,IQ1_M,Q8_0; "default,st1+sp2": "default" = the engine's pick by type).
An arm "VARIANT@-DSTRATA_A=1:-DSTRATA_B=2" runs VARIANT on kernels built with those defines.
"""

import sys

import cupy as cp
import numpy as np

import strata.gpu.experts as ex
from strata.bench import gpu_kernels as g
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels
from strata.quant.formats import QT

quants = (sys.argv[1] if len(sys.argv) > 1 else "IQ3_XXS,Q4_K,IQ1_M,Q8_0").split(",")
variants = (sys.argv[2] if len(sys.argv) > 2 else "default,st1+sp2").split(",")
passes = int(sys.argv[3]) if len(sys.argv) > 3 else 2
info = primary_device()
builds: dict = {}


def kernels(arm: str) -> Kernels:
    defs = tuple(d for d in arm.partition("@")[2].split(":") if d)
    if defs not in builds:
        builds[defs] = Kernels(cp, info.warp_size, info.sm_count, defs, info.arch)
    return builds[defs]


t = g._Timer(cp)
copy = max(g._copy_gbps(cp, t).values())
print(f"copy {copy:.0f} GB/s; variants {variants}; {passes} passes each way", flush=True)
res: dict = {}
order = (variants + variants[::-1]) * passes
for v in order:
    name = v.partition("@")[0]
    ex.MOE_VARIANT = None if name == "default" else name
    K = kernels(v)
    for q in quants:
        r = g.bench_layer(cp, K, t, np.random.default_rng(0), copy, QT[q], False, K.pdl_available)
        res.setdefault((q, v), []).append((r["moe_us"], r["moe_pct_copy"], r["device_us"]))
print(f"{'format':8} {'arm':14} {'moe us':>8} {'% copy':>7} {'layer us':>9} {'moe us, all passes'}")
for (q, v), rs in res.items():
    best = min(rs)
    print(
        f"{q:8} {v:14} {best[0]:8.2f} {best[1]:6.1f}% {min(x[2] for x in rs):9.2f} "
        + " ".join(f"{x[0]:.2f}" for x in rs)
    )
