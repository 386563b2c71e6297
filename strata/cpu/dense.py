"""Dense matrices on the CPU pool's kernels: y = x @ W.T read from the weight's own encoding.

    T = tokens, R = rows (outputs), C = columns (inputs)

The host tier's float path keeps every dense weight dequantized to float32 and multiplies the
rounded activation by it (NumPy/BLAS): 4 bytes read a weight a token, ~4.9 GB a token for
Qwen3-30B-A3B's attention and output head. `QuantLinear` instead quantizes x once as llama.cpp's
CPU matmul does (the weight's vec_dot type) and runs the pool's dot kernels row by row, rows split
over the Numba threads, straight from the quantized bytes: the integer arithmetic and roundings of
ggml's vec_dot, not of a float GEMM (results agree with the float path to float noise, not bit
for bit). Float weights (F32/F16/BF16, e.g. the router) run the float kernels the same way.
"""

from __future__ import annotations

import numpy as np
from numba import literally, njit, prange

from strata.cpu.kernels.dispatch import dot, specialized
from strata.cpu.layout import ExpertMatrix, prepare
from strata.cpu.quantize import alloc_act, quantize_rows

ROW_CHUNK = 16  # rows a parallel work item (rows of one chunk share the activation in L1)


@njit(cache=True, parallel=True)
def _rows(code, w, xq, xd, xb, x8, xf, y, chunk):
    """y [T, R] = every row of w against every activation row, chunks of rows over threads."""
    literally(code)
    n = w.shape[0]
    for c in prange((n + chunk - 1) // chunk):
        for r in range(c * chunk, min(n, (c + 1) * chunk)):
            for a in range(y.shape[0]):
                y[a, r] = dot(code, w, r, xq, xd, xb, x8, xf, a)


class QuantLinear:
    """A dense weight (`.qtype`, numpy `.shape` [R, C], `.data` bytes) and optional float bias
    [R]: callable on x [T, C] -> [T, R] float32 (the host tier's `_Linear` interface)."""

    __slots__ = ("m", "bias", "vec_dot", "_fn", "_act")

    def __init__(self, t, vec_dot, bias: np.ndarray | None = None):
        r, c = (int(s) for s in t.shape)
        self.m: ExpertMatrix = prepare(t.qtype, (1, r, c), t.data)
        self.bias = None if bias is None else np.ascontiguousarray(bias, np.float32)
        self.vec_dot = vec_dot
        self._fn = None
        self._act: tuple = ()

    @property
    def nbytes(self) -> int:
        return self.m.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        m = self.m
        x2 = np.ascontiguousarray(np.asarray(x, np.float32).reshape(-1, m.cols))
        t = x2.shape[0]
        if not self._act or self._act[0].shape[0] < t:
            self._act = alloc_act(max(t, 1), m.cols)
        act = tuple(a[:t] for a in self._act)
        quantize_rows(x2, m.act, *act)
        y = np.empty((t, m.rows), np.float32)
        args = (m.kernel, m.data, *act, y, ROW_CHUNK)
        if self._fn is None:
            self._fn = specialized(_rows, args, (0,))
        self._fn(*args)
        if self.bias is not None:
            y += self.bias
        return y.reshape(*np.shape(x)[:-1], m.rows)
