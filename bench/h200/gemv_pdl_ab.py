"""The T = 1 GEMVs built three ways and launched with 4 or 16 warps a block, timed in one
process, arms interleaved (forward, then backward): common.cuh's STRATA_GEMV_PDL_SPLIT=1 (the
default: weights asked of L2 before the PDL wait, the next kernel let in after the main loop),
=0 (wait and let in at entry), =2 (the prefetch, then wait and let in at once). Prints the best
us and % of the run's copy for each (format, shape, timing); lm_head left out."""

import sys

import cupy as cp
import numpy as np

from strata.bench import gpu_kernels as g
from strata.gpu import gemv as gemv_mod
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels
from strata.quant import fmt
from strata.quant.formats import QT

quants = sys.argv[1].split(",") if len(sys.argv) > 1 else ["Q8_0", "Q4_K", "Q6_K", "IQ3_XXS"]
g.GEMV_QUANTS = tuple(QT[q] for q in quants)
g.SHAPES = {k: v for k, v in g.SHAPES.items() if k != "lm_head"}
info = primary_device()
arms = {}  # name: (Kernels, gemv1w warps a block)
for mode in (1, 0, 2):
    defs = (f"-DSTRATA_GEMV_PDL_SPLIT={mode}",)
    K = Kernels(cp, info.warp_size, info.sm_count, defs, info.arch)
    for warps in (4, 16):
        arms[f"m{mode}w{warps}"] = (K, warps)
t = g._Timer(cp)
copy = max(g._copy_gbps(cp, t).values())
print(f"copy {copy:.0f} GB/s", flush=True)
res: dict = {}
for name in list(arms) + list(arms)[::-1]:
    K, gemv_mod.GEMV1_WARPS = arms[name]
    for r in g.bench_gemv(cp, K, t, np.random.default_rng(0), copy):
        key = (r["qtype"], r["shape"], r["variant"], r["timing"])
        res.setdefault(key, {}).setdefault(name, []).append(r["us"])
head = f"{'format':8} {'shape':12} {'kernel':7} {'timing':10}"
print(head + "".join(f" {a + ' us':>8}" for a in arms) + "".join(f" {a + ' %':>7}" for a in arms))
for (q, shape, var, how), v in res.items():
    rows, cols = g.SHAPES[shape]
    moved = fmt(QT[q]).row_bytes(cols) * rows + cols + 4 * rows
    us = [min(v[a]) for a in arms]
    pct = [100 * moved / (u * 1e-6) / 1e9 / copy for u in us]
    line = f"{q:8} {shape:12} {var:7} {how:10}" + "".join(f" {u:8.2f}" for u in us)
    print(line + "".join(f" {p:6.1f}%" for p in pct))
