"""A prompt chunk's dense GEMM on the int8 tensor cores (experts_mma.cu dense_mma through gemv.py
`gemm_mma`, 512 rows) with x staged in shared memory by the block (STRATA_MMA_XSTAGE=1, the
default) against every warp reading its fragments from global memory (-DSTRATA_MMA_XSTAGE=0);
one process, arms interleaved (forward, then backward), best median of the passes.
Usage: python3 bench/h200/mma_xstage_ab.py [QUANTS] [SHAPES]
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
info = primary_device()
arms = {
    "now": Kernels(cp, info.warp_size, info.sm_count, (), info.arch),
    "old": Kernels(cp, info.warp_size, info.sm_count, ("-DSTRATA_MMA_XSTAGE=0",), info.arch),
}
res: dict = {}
for name in list(arms) + list(arms)[::-1]:
    for q in quants:
        for shape in shapes:
            us = g.bench_prompt_gemm(cp, arms[name], QT[q], shape, np.random.default_rng(0))
            res.setdefault((q, shape), {}).setdefault(name, []).append(us)
print(
    f"{'format':8} {'shape':8} {'now us':>9} {'old us':>9} {'now TOPS':>9} {'old TOPS':>9} now/old"
)
for (q, shape), v in res.items():
    rows, cols = g.SHAPES[shape]
    now, old = min(v["now"]), min(v["old"])
    ops = 2 * rows * cols * 512
    print(
        f"{q:8} {shape:8} {now:9.1f} {old:9.1f} {ops / now / 1e6:9.1f} {ops / old / 1e6:9.1f}"
        f" {now / old:.3f}  ({fmt(QT[q]).row_bytes(cols) * rows / 1e6:.1f} MB)"
    )
