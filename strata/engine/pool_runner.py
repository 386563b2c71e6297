"""The CPU expert pool as the engine's miss runner: one pool call per layer with every miss.

T = tokens, K = picks per token, N = missed (token, expert) tasks, D = hidden.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import MODEL_TENSOR as MT

from strata.model.loader import Model


class PoolMissRunner:
    """Adapts `strata.cpu.ExpertPool.run_layer` to the engine's `experts(layer, h, ids, w)`."""

    name = "cpu-pool"

    def __init__(self, model: Model, n_threads: int = 0):
        from strata.cpu.pool import ExpertPool, prepare_layer

        self.pool = ExpertPool(n_threads or None)
        self.layers = [
            prepare_layer(
                *(model.tensor(m, i) for m in (MT.FFN_GATE_EXP, MT.FFN_UP_EXP, MT.FFN_DOWN_EXP))
            )
            for i in range(model.args.n_layer)
        ]
        self.bytes_read = 0  # expert bytes the pool's kernels read (its own layout)
        self.gguf_bytes = 0  # the same experts counted in the GGUF encoding
        self._out = np.zeros((0, model.args.n_embd), np.float32)  # grows to the largest T

    def experts(self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray):
        tok, k = np.nonzero(ids >= 0)  # [N] each
        if self._out.shape[0] < h.shape[0]:
            self._out = np.zeros((h.shape[0], h.shape[1]), np.float32)
        out = self._out[: h.shape[0]]  # [T, D], overwritten by the pool
        if tok.size == 0:
            out[:] = 0.0
            return out
        self.pool.run_layer(
            h,
            tok.astype(np.int32),
            ids[tok, k].astype(np.int32),
            weights[tok, k].astype(np.float32),
            self.layers[layer],
            out=out,
        )
        self.bytes_read += self.pool.last_bytes
        self.gguf_bytes += self.pool.last_gguf_bytes
        return out
