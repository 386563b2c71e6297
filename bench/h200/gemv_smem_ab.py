"""The T = 1 GEMVs (gemv1w, graph + PDL, as the engine launches them) with their lookup table
read through L1 (the default) against shared-memory copies staged after the row's L2 prefetch
(gemv.cu STRATA_GEMV1_SMEM_FMTS / STRATA_GEMV1_GRID_BYTES: IQ1_M's 8 KiB of codes one copy at
8192), at 4 and 16 warps a block; one process, arms interleaved (forward, then backward), lm_head
left out (AB_LM_HEAD=1: kept, for every format). Prints the best us, % of the run's copy and %
of a copy of the same bytes.
Usage: python3 bench/h200/gemv_smem_ab.py [QUANTS] [ARMS]
ARMS: comma-separated "NAME=WARPS" or "NAME=WARPS@-DSTRATA_A=1:-DSTRATA_B=2" (default below)."""

import os
import sys

import cupy as cp
import numpy as np

from strata.bench import gpu_kernels as g
from strata.gpu import gemv as gemv_mod
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels
from strata.quant.formats import QT

IQ1M = f"-DSTRATA_GEMV1_SMEM_FMTS={1 << 29}:-DSTRATA_GEMV1_GRID_BYTES=8192"
ALL = "-DSTRATA_GEMV1_SMEM_FMTS=18446744073709551615:-DSTRATA_GEMV1_GRID_BYTES=8192"
DEFAULT_ARMS = f"now=4,now16=16,iq1m=4@{IQ1M},iq1m16=16@{IQ1M},all16=16@{ALL}"

quants = (sys.argv[1] if len(sys.argv) > 1 else "IQ1_M,IQ2_S,IQ3_XXS,IQ3_S,IQ2_XXS,Q4_K").split(",")
g.GEMV_QUANTS = tuple(QT[q] for q in quants)
if os.environ.get("AB_LM_HEAD") == "1":
    g.LEGACY_QUANTS = g.GEMV_QUANTS
else:
    g.SHAPES = {k: v for k, v in g.SHAPES.items() if k != "lm_head"}
gemv_mod.GEMV1_WARPS_BY_TYPE = {}  # each arm's warps for every format
info = primary_device()
builds: dict = {}
arms: dict = {}
for spec in (sys.argv[2] if len(sys.argv) > 2 else DEFAULT_ARMS).split(","):
    name, _, rest = spec.partition("=")
    warps, _, defs = rest.partition("@")
    key = tuple(d for d in defs.split(":") if d)
    if key not in builds:
        builds[key] = Kernels(cp, info.warp_size, info.sm_count, key, info.arch)
    arms[name] = (builds[key], int(warps))
t = g._Timer(cp)
copy = max(g._copy_gbps(cp, t).values())
print(f"copy {copy:.0f} GB/s; arms {list(arms)}", flush=True)
res: dict = {}
same: dict = {}
for name in list(arms) + list(arms)[::-1]:
    K, gemv_mod.GEMV1_WARPS = arms[name]
    for r in g.bench_gemv(cp, K, t, np.random.default_rng(0), copy):
        if r["timing"] != "graph+pdl":
            continue
        key = (r["qtype"], r["shape"])
        res.setdefault(key, {}).setdefault(name, []).append(r["us"])
        same[key] = r["copy_same_size_us"]
print(f"{'format':8} {'shape':12}" + "".join(f" {a + ' us':>10}" for a in arms)
      + "".join(f" {a + ' %':>9}" for a in arms) + "  (% of a same-size copy)")  # fmt: skip
for (q, shape), v in res.items():
    us = [min(v[a]) for a in arms]
    line = f"{q:8} {shape:12}" + "".join(f" {u:10.2f}" for u in us)
    print(line + "".join(f" {100 * same[(q, shape)] / u:8.1f}%" for u in us))
