"""Which section of the gpu-kernels arm hits an illegal address (session 6, call ZZ): each
section alone, synchronized, formats one at a time; run with CUDA_LAUNCH_BLOCKING=1."""

import cupy as cp
import numpy as np

from strata.bench import gpu_kernels as g
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels

info = primary_device()
K = Kernels(cp, info.warp_size, info.sm_count, arch=info.arch)
t = g._Timer(cp)
rng = np.random.default_rng(0)
copy = max(g._copy_gbps(cp, t).values())
print("copy", round(copy), flush=True)
g.bench_launch_floor(cp, K, t)
cp.cuda.Device().synchronize()
print("floor ok", flush=True)
quants = g.GEMV_QUANTS
for qt in quants:
    g.GEMV_QUANTS = (qt,)
    print("gemv", qt.name, flush=True)
    g.bench_gemv(cp, K, t, rng, copy)
    cp.cuda.Device().synchronize()
print("gemv ok", flush=True)
r = g.bench_attention(cp, K, t, rng, copy)
cp.cuda.Device().synchronize()
print("attention ok", [(x["variant"], x["context"], x["us"]) for x in r], flush=True)
for q, legacy, pdl in ((g.QT.IQ3_XXS, True, False), (g.QT.IQ3_XXS, False, False),
                       (g.QT.Q4_K, False, False), (g.QT.IQ3_XXS, False, True)):  # fmt: skip
    print("layer", q.name, legacy, pdl, flush=True)
    print(g.bench_layer(cp, K, t, rng, copy, q, legacy, pdl), flush=True)
    cp.cuda.Device().synchronize()
print("all ok", flush=True)
