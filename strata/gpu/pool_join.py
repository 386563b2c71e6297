"""The CPU pool's rows joining the card's MoE sum on a step queued ahead (kernels/pool_join.cu).

The card waits for the host only at layers whose plan left picks to the pool (stats[2] > 0):
there each block spins until the host's release counter, in pinned host memory, reaches the
layer's ticket (`ticket`), then reads the pool's rows from pinned host memory.

D = hidden, L = layers.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.rawmod import Kernels, host_ptr, i32, ptr

THREADS = 256


def ticket(step: int, n_layer: int, layer: int) -> int:
    """The release count the card waits for at `layer` of step `step` (as the kernel computes
    it: 32-bit wrap-around)."""
    return (step * n_layer + layer + 1) & 0xFFFFFFFF


def pool_join(
    K: Kernels, stats, release_h, step_d, n_layer: int, layer: int, pool_h, moe, sh, xb, x, d: int
) -> None:
    """x [1, D] = xb + ((pool if stats[2] > 0 else +0) + moe (+ sh)); release_h: pinned uint32
    [1] the host counts up; pool_h: pinned float32 [1, D]; step_d: int32 [1] on the card."""
    K.fn("pool_join.cu", "pool_join")(
        (-(-d // THREADS),),
        (THREADS,),
        (
            stats, host_ptr(release_h), step_d, i32(n_layer), i32(layer), host_ptr(pool_h),
            moe, ptr(sh), xb, x, i32(d),
        ),
    )  # fmt: skip


def pool_join_ref(stats, pool, moe, sh, xb) -> np.ndarray:
    """The kernel's sums in its order, float32."""
    y = (pool if stats[2] > 0 else np.zeros_like(pool)).astype(np.float32) + moe
    if sh is not None:
        y = y + sh
    return (xb + y).astype(np.float32)
