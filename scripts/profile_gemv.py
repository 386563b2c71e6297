"""One GEMV per format at one shape, for ncu's per-instruction (SASS) view.

    ncu --profile-from-start off -k regex:gemv1w --set full --import-source no -o rep \
        python scripts/profile_gemv.py --quants IQ3_XXS,Q4_K --shape attn_q
    ncu --import rep.ncu-rep --page source --print-source sass --csv > sass.csv

Builds each format's weight (random, `strata.bench.gpu_kernels.SHAPES`), runs the engine's
GEMV of `--tokens` rows (1: gemv.py `gemv`, the decode step; more than GROUPED_MIN_T on a card
with int8 tensor cores: `gemm_mma`, a prompt chunk's) twice unprofiled, then once between
cudaProfilerStart/Stop: ncu sees exactly one launch per format. `--time N` also prints the
median of N launches (CUDA events, warm: the weight sits in L2 where it fits).
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quants", default="IQ3_XXS,Q4_K")
    ap.add_argument("--shape", default="attn_q")
    ap.add_argument("--tokens", type=int, default=1, help="rows of x (a prompt chunk: > 8)")
    ap.add_argument("--time", type=int, default=0, help="also time this many launches")
    a = ap.parse_args()
    import cupy as cp
    import numpy as np
    from gguf.constants import GGMLQuantizationType as QT

    from strata.bench.gpu_kernels import SHAPES
    from strata.gpu.device import primary_device
    from strata.gpu.experts import GROUPED_MIN_T
    from strata.gpu.gemv import DeviceWeight, dense_mma_nt, gemm_mma, gemv
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
    t = a.tokens
    if t < 1:
        ap.error("--tokens must be positive")
    mma = t > GROUPED_MIN_T and K.int8_mma
    nt = dense_mma_nt()  # STRATA_GPU_DENSE_MMA_NT, as the engine reads it

    def run(K, w, act, out, t):
        return gemm_mma(K, w, act, out, t, nt=nt) if mma else gemv(K, w, act, out, t)

    name = f"gemm_mma (tiles of {nt})" if mma else "gemv"
    for qt in quants:
        w = DeviceWeight(cp, random_quantized(qt, (rows, cols), rng, 0.05), qt, rows, cols)
        act = ActBuf(cp, cols, t, w.vec_dot)
        norm_quant(K, cp.asarray(rng.standard_normal((t, cols)).astype(np.float32)), t, act=act)
        out = cp.empty((t, rows), np.float32)
        for _ in range(2):
            run(K, w, act, out, t)
        cp.cuda.runtime.deviceSynchronize()
        cp.cuda.runtime.profilerStart()
        run(K, w, act, out, t)
        cp.cuda.runtime.deviceSynchronize()
        cp.cuda.runtime.profilerStop()
        say = f"{qt.name} {a.shape} {rows}x{cols} T={t}: profiled one {name}"
        if a.time:
            ev = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(a.time)]
            for e0, e1 in ev:
                e0.record()
                run(K, w, act, out, t)
                e1.record()
            e1.synchronize()
            us = sorted(1e3 * cp.cuda.get_elapsed_time(e0, e1) for e0, e1 in ev)
            say += f"; median {us[len(us) // 2]:.1f} us of {a.time}"
        print(say, flush=True)


if __name__ == "__main__":
    main()
