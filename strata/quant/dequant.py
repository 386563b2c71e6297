"""Model tensors as floats through the reference codec (`gguf.quants.dequantize`)."""

from __future__ import annotations

import gguf.quants
import numpy as np


def dequant(t, index: int | slice | None = None, dtype=np.float32) -> np.ndarray:
    """Tensor t (`.data` bytes, numpy `.shape`, `.qtype`), or `t[index]` along its first axis,
    as floats, shape as numpy sees it."""
    raw = t.data.view(np.uint8)
    shape = t.shape
    if len(shape) > 1:
        raw = raw.reshape(*shape[:-1], -1)
    if index is not None:
        raw = raw[index]
        shape = raw.shape[:-1] + (shape[-1],)
    out = gguf.quants.dequantize(np.ascontiguousarray(raw), t.qtype)
    return out.reshape(shape).astype(dtype, copy=False)
