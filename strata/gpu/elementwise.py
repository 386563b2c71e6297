"""Element-wise kernels (kernels/elementwise.cu): SiLU*up, sigmoid row gate, greedy argmax."""

from __future__ import annotations

import numpy as np

from strata.gpu.rawmod import Kernels, i32

THREADS = 256


def silu_mul(K: Kernels, g, u, out, n: int) -> None:
    K.fn("elementwise.cu", "silu_mul")((-(-n // THREADS),), (THREADS,), (g, u, out, i32(n)))


def sigmoid_scale_rows(K: Kernels, y, gate_logits, t: int, d: int) -> None:
    K.fn("elementwise.cu", "sigmoid_scale_rows")(
        (-(-d // THREADS), t), (THREADS,), (y, gate_logits, i32(d))
    )


def argmax_rows(K: Kernels, logits, t: int, v: int, ids) -> None:
    """ids[:t] = argmax of each logits row (lowest index on ties): greedy sampling."""
    K.fn("elementwise.cu", "argmax_rows")((t,), (1024,), (logits, i32(v), ids))


def f16_convert(K: Kernels, hin, fout, fin, hout, n: int) -> None:
    """fout = f16 bits -> float32, hout = float32 -> f16 bits (round to nearest even)."""
    K.fn("elementwise.cu", "f16_convert")(
        (-(-n // THREADS),), (THREADS,), (hin, fout, fin, hout, i32(n))
    )


def silu_mul_ref(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return g / (np.float32(1.0) + np.exp(-g)) * u
