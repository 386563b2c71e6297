"""Integer lookup tables of the i-quants, taken from gguf-py's reference codec (`gguf.quants`).

gguf-py stores each grid packed and decodes it to float32 on first use; the kernels want the same
values as small integers (exact: every grid value is an integer).
"""

from __future__ import annotations

import numpy as np
from gguf import quants as gq


def _grid(cls, dtype) -> np.ndarray:
    cls.init_grid()
    g = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    out = g.astype(dtype)
    assert np.array_equal(out.astype(np.float32), g), cls.__name__
    return np.ascontiguousarray(out)


IQ3XXS_GRID = _grid(gq.IQ3_XXS, np.uint8)  # [256, 4]  values 4..62
IQ3S_GRID = _grid(gq.IQ3_S, np.uint8)  # [512, 4]  odd values 1..15
IQ2XXS_GRID = _grid(gq.IQ2_XXS, np.uint8)  # [256, 8]  values 8, 25, 43
IQ2S_GRID = _grid(gq.IQ2_S, np.uint8)  # [1024, 8]
IQ1S_GRID = _grid(gq.IQ1_S, np.int8)  # [2048, 8]  values -1, 0, 1 (IQ1_M uses it too)
KSIGNS = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8).copy()  # [128] 7 sign bits + parity
KVALUES_IQ4NL = np.array(gq.IQ4_NL.kvalues, dtype=np.int8)  # [16]

# the eight IQ3_XXS magnitudes in increasing order (a weight is one of them, with a sign)
IQ3XXS_LEVELS = np.unique(IQ3XXS_GRID).astype(np.int8)
assert IQ3XXS_LEVELS.size == 8
# MXFP4's E2M1 values doubled (ggml's kvalues_mxfp4: 0, 1, 2, 3, 4, 6, 8, 12, then negated)
KVALUES_MXFP4 = np.array(gq.MXFP4.kvalues, dtype=np.int8)  # [16]
