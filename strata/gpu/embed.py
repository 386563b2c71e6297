"""Embedding gather from the quantized token_embd (kernels/embed.cu): launcher and reference."""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from strata.gpu.gemv import F_NAMES, Q_NAMES, DeviceWeight
from strata.gpu.rawmod import Kernels, i32

QT = GGMLQuantizationType
THREADS = 128


def embed(K: Kernels, table: DeviceWeight, ids, t: int, out) -> None:
    """out[:t] = dequant(table[ids[:t]]); ids int32 on the device, out [*, D] float32."""
    d = table.cols
    if table.qtype in Q_NAMES:
        nsub = d // 32
        grid = ((nsub + THREADS - 1) // THREADS, t)
        K.fn("embed.cu", f"embed_{Q_NAMES[table.qtype]}")(
            grid, (THREADS,), (table.buf, ids, i32(d), out)
        )
    elif table.qtype in F_NAMES:
        grid = ((d + THREADS - 1) // THREADS, t)
        K.fn("embed.cu", "embed_float")(
            grid, (THREADS,), (table.buf, ids, i32(d), i32(int(table.qtype)), out)
        )
    else:
        raise ValueError(f"no embedding kernel for {table.qtype.name}")


def embed_ref(raw: np.ndarray, qtype, ids: np.ndarray) -> np.ndarray:
    return dequantize(np.ascontiguousarray(raw[ids]), QT(int(qtype))).astype(np.float32)
