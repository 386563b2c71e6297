"""One T = 1 GEMV per format at one shape, for ncu's per-instruction (SASS) view.

    ncu --profile-from-start off -k regex:gemv1w --set full --import-source no -o rep \
        python scripts/profile_gemv.py --quants IQ3_XXS,Q4_K --shape attn_q
    ncu --import rep.ncu-rep --page source --print-source sass --csv > sass.csv

Builds each format's weight (random, `strata.bench.gpu_kernels.SHAPES`), runs the engine's T = 1
GEMV (gemv.py `gemv`) twice unprofiled, then once between cudaProfilerStart/Stop: ncu sees
exactly one launch per format.
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quants", default="IQ3_XXS,Q4_K")
    ap.add_argument("--shape", default="attn_q")
    a = ap.parse_args()
    import cupy as cp
    import numpy as np
    from gguf.constants import GGMLQuantizationType as QT

    from strata.bench.gpu_kernels import SHAPES
    from strata.gpu.device import primary_device
    from strata.gpu.gemv import DeviceWeight, gemv
    from strata.gpu.norm_quant import ActBuf, norm_quant
    from strata.gpu.rawmod import kernels_for
    from strata.quant import random_quantized

    if a.shape not in SHAPES:
        ap.error(f"unknown shape {a.shape!r} (known: {', '.join(SHAPES)})")
    try:
        quants = [QT[q] for q in a.quants.split(",")]
    except KeyError as e:
        ap.error(f"unknown quant {e}")
    rows, cols = SHAPES[a.shape]
    K = kernels_for(primary_device())
    rng = np.random.default_rng(0)
    for qt in quants:
        w = DeviceWeight(cp, random_quantized(qt, (rows, cols), rng, 0.05), qt, rows, cols)
        act = ActBuf(cp, cols, 1, w.vec_dot)
        norm_quant(K, cp.asarray(rng.standard_normal((1, cols)).astype(np.float32)), 1, act=act)
        out = cp.empty((1, rows), np.float32)
        for _ in range(2):
            gemv(K, w, act, out, 1)
        cp.cuda.runtime.deviceSynchronize()
        cp.cuda.runtime.profilerStart()
        gemv(K, w, act, out, 1)
        cp.cuda.runtime.deviceSynchronize()
        cp.cuda.runtime.profilerStop()
        print(f"{qt.name} {a.shape} {rows}x{cols}: profiled one gemv", flush=True)


if __name__ == "__main__":
    main()
