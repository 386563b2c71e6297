"""The T = 1 GEMVs as the engine launches them ("now": the split PDL form of common.cuh, the
trigger placed by gemv.py pdl_early, GEMV1_WARPS a block) against session 15's (wait and
trigger at entry, -DSTRATA_GEMV_PDL_SPLIT=0, 4 warps) and the split form with the trigger
always early or always late (16 warps); one process, arms interleaved (forward, then backward).
Prints the best us and % of the run's copy for each (format, shape, timing); lm_head left
out. Session 16's first calls swept the forms x 4/16 warps (bench/results/session16-*.md)."""

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
gemv_mod.GEMV1_WARPS_BY_TYPE = {}  # each arm's warps for every format
info = primary_device()
split = Kernels(cp, info.warp_size, info.sm_count, (), info.arch)
entry = Kernels(cp, info.warp_size, info.sm_count, ("-DSTRATA_GEMV_PDL_SPLIT=0",), info.arch)
rule = gemv_mod.pdl_early
arms = {  # name: (Kernels, gemv1w warps a block, pdl_early)
    "now": (split, gemv_mod.GEMV1_WARPS, rule),
    "entry4": (entry, 4, rule),  # session 15's: wait and trigger at entry, 4 warps
    "early16": (split, 16, lambda w, wpr: True),
    "late16": (split, 16, lambda w, wpr: False),
}
t = g._Timer(cp)
copy = max(g._copy_gbps(cp, t).values())
print(f"copy {copy:.0f} GB/s", flush=True)
res: dict = {}
for name in list(arms) + list(arms)[::-1]:
    K, gemv_mod.GEMV1_WARPS, gemv_mod.pdl_early = arms[name]
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
