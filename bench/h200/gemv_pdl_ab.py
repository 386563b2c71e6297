"""The T = 1 GEMVs built three ways, timed in one process, arms interleaved (A B C C B A):
common.cuh's STRATA_GEMV_PDL_SPLIT=1 (the default: weights asked of L2 before the PDL wait, the
next kernel let in after the main loop), =0 (wait and let in at entry), =2 (the prefetch, then
wait and let in at once). Prints the best us and % of the run's copy for each (format, shape,
timing)."""

import sys

import cupy as cp
import numpy as np

from strata.bench import gpu_kernels as g
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels
from strata.quant import fmt
from strata.quant.formats import QT

quants = sys.argv[1].split(",") if len(sys.argv) > 1 else ["Q8_0", "Q4_K", "Q6_K", "IQ3_XXS"]
g.GEMV_QUANTS = tuple(QT[q] for q in quants)
info = primary_device()
arms = {
    "split": Kernels(cp, info.warp_size, info.sm_count, arch=info.arch),
    "entry": Kernels(cp, info.warp_size, info.sm_count, ("-DSTRATA_GEMV_PDL_SPLIT=0",), info.arch),
    "early": Kernels(cp, info.warp_size, info.sm_count, ("-DSTRATA_GEMV_PDL_SPLIT=2",), info.arch),
}
t = g._Timer(cp)
copy = max(g._copy_gbps(cp, t).values())
print(f"copy {copy:.0f} GB/s", flush=True)
res: dict = {}
for name in ("split", "entry", "early", "early", "entry", "split"):
    for r in g.bench_gemv(cp, arms[name], t, np.random.default_rng(0), copy):
        key = (r["qtype"], r["shape"], r["variant"], r["timing"])
        res.setdefault(key, {}).setdefault(name, []).append(r["us"])
print(
    f"{'format':8} {'shape':12} {'kernel':7} {'timing':10}"
    + "".join(f" {a + ' us':>9}" for a in arms)
    + "".join(f" {a + ' %':>8}" for a in arms)
)
for (q, shape, var, how), v in res.items():
    rows, cols = g.SHAPES[shape]
    moved = fmt(QT[q]).row_bytes(cols) * rows + cols + 4 * rows
    us = [min(v[a]) for a in arms]
    pct = [100 * moved / (u * 1e-6) / 1e9 / copy for u in us]
    print(
        f"{q:8} {shape:12} {var:7} {how:10}"
        + "".join(f" {u:9.2f}" for u in us)
        + "".join(f" {p:7.1f}%" for p in pct)
    )
