"""A prompt chunk's dense GEMM on the int8 tensor cores (experts_mma.cu dense_mma through gemv.py
`gemm_mma`, 512 rows): the default build against one with compile-time knobs added (default
-DSTRATA_MMA_XSTAGE=0: every warp reads its x fragments from global memory, as before session
17; call KE); one process, arms interleaved (forward, then backward), best median of the passes,
and the largest difference between the two builds' products (relative to the product's scale).
Usage: python3 bench/h200/mma_xstage_ab.py [QUANTS] [SHAPES] [DEFINES]
"""

import sys

import cupy as cp
import numpy as np

from strata.bench import gpu_kernels as g
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels
from strata.quant import fmt
from strata.quant.formats import QT

quants = (sys.argv[1] if len(sys.argv) > 1 else "Q8_0,Q4_K,Q6_K,IQ4_XS,IQ3_XXS").split(",")
shapes = (sys.argv[2] if len(sys.argv) > 2 else "attn_q,attn_o").split(",")
alt = tuple((sys.argv[3] if len(sys.argv) > 3 else "-DSTRATA_MMA_XSTAGE=0").split())
info = primary_device()
arms = {
    "now": Kernels(cp, info.warp_size, info.sm_count, (), info.arch),
    "alt": Kernels(cp, info.warp_size, info.sm_count, alt, info.arch),
}
print(f"alt: {' '.join(alt)}")
res: dict = {}
outs: dict = {}
for name in list(arms) + list(arms)[::-1]:
    for q in quants:
        for shape in shapes:
            o = outs.setdefault((q, shape, name), [])
            us = g.bench_prompt_gemm(cp, arms[name], QT[q], shape, np.random.default_rng(0), outs=o)
            res.setdefault((q, shape), {}).setdefault(name, []).append(us)
head = ("format", "shape", "now us", "alt us", "now TOPS", "alt TOPS")
print("{:8} {:8} {:>9} {:>9} {:>9} {:>9} now/alt  max|now-alt|/max|now|".format(*head))
for (q, shape), v in res.items():
    rows, cols = g.SHAPES[shape]
    now, old = min(v["now"]), min(v["alt"])
    ops = 2 * rows * cols * 512
    a, b = outs[(q, shape, "now")][0], outs[(q, shape, "alt")][0]
    diff = float(np.abs(a - b).max() / np.abs(a).max())
    print(
        f"{q:8} {shape:8} {now:9.1f} {old:9.1f} {ops / now / 1e6:9.1f} {ops / old / 1e6:9.1f}"
        f" {now / old:.3f}  {diff:.2e}  ({fmt(QT[q]).row_bytes(cols) * rows / 1e6:.1f} MB)"
    )
