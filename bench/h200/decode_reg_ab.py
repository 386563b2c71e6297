"""The decode of quant_blocks.cuh as built now (STRATA_REG_DECODE: IQ4_XS from register tables
by byte permutes, IQ1_M's values four bytes at a time; STRATA_GEMV1_SMEM_GRID: gemv1w_* reads
the small i-quant grids from shared memory) against the build without both ("old"), one
process, arms interleaved (forward, then backward), best of the passes:
  - the T = 1 GEMVs of `strata.bench.gpu_kernels.bench_gemv` (graph + PDL, % of the run's copy),
    lm_head included (a grid of 151936 rows: the decode's throughput, launch cost negligible);
  - one decode layer's MoE part (`bench_layer`: 8 experts at T = 1, graph + PDL);
  - a 512-row prompt chunk's dense GEMM (`gemm_mma`) at attn_q, CUDA events, median of 20.
Usage: python3 bench/h200/decode_reg_ab.py [QUANTS] [OLD DEFINES]
(default IQ4_XS,IQ1_M,IQ3_XXS,IQ3_S,IQ2_XXS,Q4_K; the "old" arm's compile defines, default
"-DSTRATA_REG_DECODE=0 -DSTRATA_GEMV1_SMEM_GRID=0": any other knob's build against the default)
"""

import sys

import cupy as cp
import numpy as np

from strata.bench import gpu_kernels as g
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels
from strata.quant import fmt
from strata.quant.formats import QT

DEFAULT = "IQ4_XS,IQ1_M,IQ3_XXS,IQ3_S,IQ2_XXS,Q4_K"
quants = (sys.argv[1] if len(sys.argv) > 1 else DEFAULT).split(",")
g.GEMV_QUANTS = tuple(QT[q] for q in quants)
g.SHAPES = {k: v for k, v in g.SHAPES.items() if k in ("attn_q", "attn_o", "lm_head")}
g.LEGACY_QUANTS, g.LEGACY_SHAPES = g.GEMV_QUANTS, ("lm_head",)  # lm_head only runs with legacy
info = primary_device()
old = "-DSTRATA_REG_DECODE=0 -DSTRATA_GEMV1_SMEM_GRID=0"
old = tuple((sys.argv[2] if len(sys.argv) > 2 else old).split())
print(f"old: {' '.join(old)}")
arms = {
    "now": Kernels(cp, info.warp_size, info.sm_count, (), info.arch),
    "old": Kernels(cp, info.warp_size, info.sm_count, old, info.arch),
}
t = g._Timer(cp)
copy = max(g._copy_gbps(cp, t).values())
print(f"copy {copy:.0f} GB/s", flush=True)


res: dict = {}


def add(key, arm, us, nbytes):
    res.setdefault(key, {}).setdefault(arm, []).append((us, nbytes))


for name in list(arms) + list(arms)[::-1]:
    K = arms[name]
    print(f"pass {name}", flush=True)
    for r in g.bench_gemv(cp, K, t, np.random.default_rng(0), copy):
        if r["timing"] != "graph+pdl" and r["shape"] != "lm_head":
            continue
        add(("gemv", r["qtype"], r["shape"], r["variant"], r["timing"]), name, r["us"], r["bytes"])
    for q in quants:
        if QT[q] in (QT.IQ4_XS, QT.IQ1_M, QT.IQ3_XXS, QT.Q8_0):
            rng = np.random.default_rng(0)
            r = g.bench_layer(cp, K, t, rng, copy, QT[q], False, K.pdl_available)
            nbytes = r["moe_us"] * r["moe_gbps"] * 1e3  # moe_gbps = bytes / us / 1e3
            add(("moe T=1", q, "8 experts", "moe", r["timing"]), name, r["moe_us"], nbytes)
        if K.int8_mma:
            us = g.bench_prompt_gemm(cp, K, QT[q], "attn_q", np.random.default_rng(0))
            rows, cols = g.SHAPES["attn_q"]
            nbytes = fmt(QT[q]).row_bytes(cols) * rows
            add(("gemm T=512", q, "attn_q", "dense_mma", "events"), name, us, nbytes)
print(f"{'what':10} {'format':8} {'shape':10} {'kernel':9} {'timing':10}"
      + "".join(f" {a + ' us':>9}" for a in arms) + "".join(f" {a + ' %':>7}" for a in arms)
      + "  now/old")  # fmt: skip
for (what, q, shape, var, how), v in res.items():
    us = [min(u for u, _ in v[a]) for a in arms]
    moved = v["now"][0][1]
    pct = [100 * moved / (u * 1e-6) / 1e9 / copy for u in us]
    print(f"{what:10} {q:8} {shape:10} {var:9} {how:10}" + "".join(f" {u:9.2f}" for u in us)
          + "".join(f" {p:6.1f}%" for p in pct) + f"  {us[0] / us[1]:.3f}")  # fmt: skip
