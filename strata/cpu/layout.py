"""Expert tensors prepared for the pool: the kernel each gets and the bytes it reads.

`ExpertMatrix` is one expert tensor [E, R, C] (R output rows of C inputs per expert) as a uint8
matrix [E * R, row_bytes] plus the integer kernel code that reads it. GGUF bytes are used in
place (a view into the mmap) unless the host's kernel reads a repacked layout (`KERNEL_TABLE`):

    lut4: IQ3_XXS, IQ3_S, IQ2_XXS as 4-bit codes (lut4.py), IQ2_S with its 16 scales
          (iq2/s_lut4_avx2.py): AVX2 kernels, on AVX-512 hosts too
    t2:   IQ1_M as 2-bit ternary codes (iq1/t2_avx2.py): AVX2, or AVX-512 (iq1/t2_avx512.py)
    pm:   IQ3_XXS position-major (iq3/pm_avx512.py, 1.04x the bytes): AVX-512 hosts only

Portable hosts read every format's GGUF bytes with the plain @njit kernels.
Every transform is lossless (tests rebuild the GGUF bytes); `gguf_bytes` is what the file
holds, `nbytes` what the kernel reads, so bandwidth can be reported either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels import lut4
from strata.cpu.kernels.features import avx512_enabled, simd_enabled
from strata.cpu.kernels.iq1 import t2_avx2 as iq1_t2
from strata.cpu.kernels.iq2 import s_lut4_avx2 as iq2s_lut4
from strata.cpu.kernels.iq3 import pm_avx512 as iq3_pm
from strata.cpu.quantize import act_code
from strata.quant.formats import QT, fmt

GGUF = "gguf"
# the fastest kernel per host class and format, measured on each class: (layout, kernel code)
KERNEL_TABLE = {
    "portable": {
        QT.F32: (GGUF, K.K_F32),
        QT.F16: (GGUF, K.K_F16),
        QT.BF16: (GGUF, K.K_BF16),
        QT.Q8_0: (GGUF, K.K_Q8_0),
        QT.Q4_K: (GGUF, K.K_Q4_K),
        QT.Q5_K: (GGUF, K.K_Q5_K),
        QT.Q6_K: (GGUF, K.K_Q6_K),
        QT.IQ4_XS: (GGUF, K.K_IQ4_XS),
        QT.IQ3_XXS: (GGUF, K.K_IQ3_XXS),
        QT.IQ3_S: (GGUF, K.K_IQ3_S),
        QT.IQ2_XXS: (GGUF, K.K_IQ2_XXS),
        QT.IQ2_S: (GGUF, K.K_IQ2_S),
        QT.IQ1_M: (GGUF, K.K_IQ1_M),
        QT.MXFP4: (GGUF, K.K_MXFP4),
    },
    "avx2": {
        QT.F32: (GGUF, K.K_F32),
        QT.F16: (GGUF, K.K_F16),
        QT.BF16: (GGUF, K.K_BF16),
        QT.Q8_0: (GGUF, K.K_Q8_0_AVX2),
        QT.Q4_K: (GGUF, K.K_Q4_K_AVX2),
        QT.Q5_K: (GGUF, K.K_Q5_K_AVX2),
        QT.Q6_K: (GGUF, K.K_Q6_K_AVX2),
        QT.IQ4_XS: (GGUF, K.K_IQ4_XS_AVX2),
        QT.IQ3_XXS: ("lut4", K.K_IQ3_XXS_LUT4_AVX2),
        QT.IQ3_S: ("lut4", K.K_IQ3_S_LUT4_AVX2),
        QT.IQ2_XXS: ("lut4", K.K_IQ2_XXS_LUT4_AVX2),
        QT.IQ2_S: ("lut4", K.K_IQ2_S_LUT4_AVX2),
        QT.IQ1_M: ("t2", K.K_IQ1_M_T2_AVX2),
        QT.MXFP4: (GGUF, K.K_MXFP4_AVX2),
    },
}
# AVX-512 VBMI + VNNI hosts: the AVX2 table but for these
KERNEL_TABLE["avx512"] = {
    **KERNEL_TABLE["avx2"],
    QT.Q4_K: (GGUF, K.K_Q4_K_AVX512),
    QT.Q5_K: (GGUF, K.K_Q5_K_AVX512),
    QT.Q6_K: (GGUF, K.K_Q6_K_AVX512),
    QT.IQ3_XXS: ("pm", K.K_IQ3_XXS_PM_AVX512),
    QT.IQ1_M: ("t2", K.K_IQ1_M_T2_AVX512),
}
# (format, layout) -> (repack, unpack)
REPACKS = {
    (QT.IQ3_XXS, "lut4"): (lut4.repack, lut4.unpack),
    (QT.IQ3_S, "lut4"): (lut4.repack_s, lut4.unpack_s),
    (QT.IQ2_XXS, "lut4"): (lut4.repack_2xxs, lut4.unpack_2xxs),
    (QT.IQ2_S, "lut4"): (iq2s_lut4.repack, iq2s_lut4.unpack),
    (QT.IQ1_M, "t2"): (iq1_t2.repack, iq1_t2.unpack),
    (QT.IQ3_XXS, "pm"): (iq3_pm.repack, iq3_pm.unpack),
}


def host_class(simd: bool | None = None) -> str:
    """The `KERNEL_TABLE` row this host takes (simd False: the portable one; None: the host's)."""
    simd = simd_enabled() if simd is None else simd
    if avx512_enabled(simd):
        return "avx512"
    return "avx2" if simd else "portable"


@dataclass(frozen=True)
class ExpertMatrix:
    """One expert tensor ready for the kernels."""

    qtype: GGMLQuantizationType
    n_expert: int  # E
    rows: int  # R: outputs per expert
    cols: int  # C: inputs per expert
    data: np.ndarray  # uint8 [E * R, row_bytes]
    kernel: int  # dispatch code
    act: int  # activation code (the weight's vec_dot type)
    layout: str  # "gguf" or a repack's name ("lut4", "t2", "pm")
    nbytes: int = 0  # bytes the kernel reads for the whole tensor (set by __post_init__)
    gguf_bytes: int = 0  # bytes of the tensor in the GGUF's own encoding

    type_key: tuple = ()  # what Numba's type of `data` depends on (compiled-entry cache key)

    def __post_init__(self):
        d = self.data
        key = (self.kernel, d.dtype.str, d.ndim, d.flags.c_contiguous, d.flags.writeable)
        object.__setattr__(self, "type_key", key)
        object.__setattr__(self, "nbytes", int(self.data.nbytes))
        shape = (self.n_expert, self.rows, self.cols)
        object.__setattr__(self, "gguf_bytes", fmt(self.qtype).tensor_bytes(shape))

    @property
    def expert_nbytes(self) -> int:
        return self.nbytes // self.n_expert

    @property
    def expert_gguf_bytes(self) -> int:
        return self.gguf_bytes // self.n_expert

    def gguf_rows(self) -> np.ndarray:
        """The GGUF bytes [E * R, row_bytes] (undoing the repack; tests and the pack writer)."""
        if self.layout == GGUF:
            return self.data
        return REPACKS[(self.qtype, self.layout)][1](self.data)


def prepare(qtype, shape, data, simd: bool | None = None) -> ExpertMatrix:
    """An `ExpertMatrix` from a GGUF expert tensor: type, numpy shape [E, R, C] and raw bytes,
    in the layout and kernel `KERNEL_TABLE` gives the host (simd=None: `simd_enabled()`)."""
    f = fmt(qtype)
    if len(shape) != 3:
        raise ValueError(f"an expert tensor has shape [E, R, C], got {list(shape)}")
    e, r, c = (int(s) for s in shape)
    if c % 256 and f.vec_dot == QT.Q8_K:
        raise ValueError(f"{f.name}: input length {c} is not a multiple of 256")
    raw = np.asarray(data).view(np.uint8).reshape(e * r, f.row_bytes(c))
    qt = f.qtype
    lay, kernel = KERNEL_TABLE[host_class(simd)][qt]
    if lay != GGUF:
        raw = REPACKS[(qt, lay)][0](raw)
    return ExpertMatrix(qt, e, r, c, raw, kernel, act_code(f.vec_dot), lay)


def prepare_tensor(t, simd: bool | None = None) -> ExpertMatrix:
    """`prepare` for anything with `.qtype`, `.shape` and `.data` (a model's TensorRef)."""
    if isinstance(t, ExpertMatrix):
        return t
    return prepare(t.qtype, t.shape, t.data, simd)
