"""Registry of the GGML block formats Strata reads: sizes and layouts shared by both tiers.

`gguf.quants` is the reference codec (bit-exact dequantization); this module only records what
the kernels need to know about each format and which activation format llama.cpp pairs with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

QT = GGMLQuantizationType
QK_K = 256


@dataclass(frozen=True)
class BlockFormat:
    """One GGML tensor type: `block_elems` weights stored in `block_bytes` bytes."""

    qtype: GGMLQuantizationType
    block_elems: int
    block_bytes: int
    # the activation type llama.cpp's CPU backend quantizes the other operand to (its vec_dot_type)
    vec_dot: GGMLQuantizationType
    # layout of one block, in storage order: (field, numpy dtype, count)
    layout: tuple[tuple[str, str, int], ...]
    can_hold_experts: bool = True

    @property
    def name(self) -> str:
        return self.qtype.name

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.block_bytes / self.block_elems

    def row_bytes(self, n: int) -> int:
        """Bytes of one row of `n` elements; `n` must be a whole number of blocks."""
        if n % self.block_elems:
            raise ValueError(
                f"{self.name}: row length {n} is not a multiple of "
                f"the block size {self.block_elems}"
            )
        return n // self.block_elems * self.block_bytes

    def tensor_bytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of a tensor whose numpy shape is `shape` (last axis contiguous)."""
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        return rows * self.row_bytes(int(shape[-1]))

    def block_dtype(self) -> np.dtype:
        """A structured numpy dtype for one block (for kernels that index fields by name)."""
        return np.dtype([(f, dt, (n,)) if n > 1 else (f, dt) for f, dt, n in self.layout])


FORMATS: dict[GGMLQuantizationType, BlockFormat] = {}


def _register(qtype: QT, vec_dot: QT, layout, can_hold_experts: bool = True) -> None:
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    fmt = BlockFormat(qtype, elems, nbytes, vec_dot, tuple(layout), can_hold_experts)
    assert fmt.block_dtype().itemsize == nbytes, (qtype.name, fmt.block_dtype().itemsize, nbytes)
    FORMATS[qtype] = fmt


# layouts follow ggml-common.h (block_q8_0, block_q4_K, ...)
_register(QT.F32, QT.F32, [("v", "<f4", 1)])
_register(QT.F16, QT.F16, [("v", "<f2", 1)])
_register(QT.BF16, QT.BF16, [("v", "<u2", 1)])
_register(QT.Q8_0, QT.Q8_0, [("d", "<f2", 1), ("qs", "i1", 32)])
_register(
    QT.Q4_K,
    QT.Q8_K,
    [("d", "<f2", 1), ("dmin", "<f2", 1), ("scales", "u1", 12), ("qs", "u1", QK_K // 2)],
)
_register(
    QT.Q5_K,
    QT.Q8_K,
    [
        ("d", "<f2", 1),
        ("dmin", "<f2", 1),
        ("scales", "u1", 12),
        ("qh", "u1", QK_K // 8),
        ("qs", "u1", QK_K // 2),
    ],
)
_register(
    QT.Q6_K,
    QT.Q8_K,
    [
        ("ql", "u1", QK_K // 2),
        ("qh", "u1", QK_K // 4),
        ("scales", "i1", QK_K // 16),
        ("d", "<f2", 1),
    ],
)
_register(
    QT.IQ4_XS,
    QT.Q8_K,
    [
        ("d", "<f2", 1),
        ("scales_h", "<u2", 1),
        ("scales_l", "u1", QK_K // 64),
        ("qs", "u1", QK_K // 2),
    ],
)
_register(
    QT.IQ3_S,
    QT.Q8_K,
    [
        ("d", "<f2", 1),
        ("qs", "u1", QK_K // 4),
        ("qh", "u1", QK_K // 32),
        ("signs", "u1", QK_K // 8),
        ("scales", "u1", QK_K // 64),
    ],
)
# MXFP4 (OCP microscaling, gpt-oss experts): an E8M0 scale byte e (2**(e - 127)) and 32 E2M1
# codes as nibbles (weights j and j + 16 in byte j); ggml keeps the E2M1 values doubled as int8
# (kvalues_mxfp4) and the scale halved (GGML_E8M0_TO_FP32_HALF)
_register(QT.MXFP4, QT.Q8_0, [("e", "u1", 1), ("qs", "u1", 16)])
_register(QT.IQ3_XXS, QT.Q8_K, [("d", "<f2", 1), ("qs", "u1", 3 * QK_K // 8)])
_register(QT.IQ2_XXS, QT.Q8_K, [("d", "<f2", 1), ("qs", "<u2", QK_K // 8)])
_register(
    QT.IQ2_S,
    QT.Q8_K,
    [
        ("d", "<f2", 1),
        ("qs", "u1", QK_K // 4),
        ("qh", "u1", QK_K // 32),
        ("scales", "u1", QK_K // 32),
    ],
)
_register(
    QT.IQ1_M,
    QT.Q8_K,
    [("qs", "u1", QK_K // 8), ("qh", "u1", QK_K // 16), ("scales", "u1", QK_K // 32)],
)
# activation-only format (never stored in a model file by Strata, used by the CPU kernels)
_register(
    QT.Q8_K,
    QT.Q8_K,
    [("d", "<f4", 1), ("qs", "i1", QK_K), ("bsums", "<i2", QK_K // 16)],
    can_hold_experts=False,
)


def fmt(qtype: GGMLQuantizationType | int | str) -> BlockFormat:
    """Look a format up by enum, integer id or name; a one-line error for anything else."""
    try:
        if isinstance(qtype, str):
            qtype = QT[qtype.upper()]
        qtype = QT(int(qtype))
    except (KeyError, ValueError):
        raise UnsupportedType(f"unknown tensor type {qtype!r}") from None
    if qtype not in FORMATS:
        supported = ", ".join(f.name for f in FORMATS.values() if f.qtype != QT.Q8_K)
        raise UnsupportedType(f"unsupported tensor type {qtype.name} (supported: {supported})")
    return FORMATS[qtype]


class UnsupportedType(ValueError):
    """A tensor type Strata has no kernels for."""


MODEL_TYPES = tuple(q for q in FORMATS if q != QT.Q8_K)
