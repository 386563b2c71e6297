"""The Q8_0 AVX2 kernel called directly from a jitted loop over 256 rows of 2048 weights (no
dispatch, weights in L2), best of 20: Gweights/s, beside the portable kernel.

    PYTHONPATH=. python bench/q8_0_direct.py      # (run on two checkouts for an A/B)
"""

import time

import numpy as np
from numba import njit

from strata.cpu.kernels.iq4_avx2 import dot_q8_0_avx2
from strata.cpu.kernels.q8_0 import dot_q8_0

R, D = 256, 2048


def _loop(kern):
    @njit
    def run(w, xq, xd, xb, x8, xf, reps):
        s = np.float32(0)
        for _ in range(reps):
            for r in range(w.shape[0]):
                s += kern(w, r, xq, xd, xb, x8, xf, 0)
        return s

    return run


def main() -> None:
    rng = np.random.default_rng(0)
    w = rng.integers(0, 255, (R, D // 32 * 34), dtype=np.uint8)
    scales = (rng.standard_normal((R, D // 32)) * 0.01).astype(np.float16)
    w.reshape(R, -1, 34)[:, :, 0:2] = scales.view(np.uint8).reshape(R, -1, 2)
    xq = rng.integers(-127, 127, (1, D)).astype(np.int8)
    xd = (rng.random((1, D // 32)) * 0.1).astype(np.float32)
    pad = np.zeros((1, 1), np.int16), np.zeros((1, 1), np.int16), np.zeros((1, 1), np.float32)
    for name, kern in (("avx2", dot_q8_0_avx2), ("portable", dot_q8_0)):
        run = _loop(kern)
        run(w, xq, xd, *pad, 1)
        best = 1e9
        for _ in range(20):
            t = time.perf_counter()
            run(w, xq, xd, *pad, 10)
            best = min(best, time.perf_counter() - t)
        print(f"{name:9s} {R * D * 10 / best / 1e9:6.2f} Gweights/s")


if __name__ == "__main__":
    main()
