"""Expert tensors prepared for the pool: the kernel each gets and the bytes it reads.

`ExpertMatrix` is one expert tensor [E, R, C] (R output rows of C inputs per expert) as a uint8
matrix [E * R, row_bytes] plus the integer kernel code that reads it. GGUF bytes are used in
place (a view into the mmap) unless a repacked layout makes the SIMD kernel cheaper:

    IQ3_XXS -> LUT4 (4-bit codes, 1.37x the bytes; lut4.py)
    IQ3_S   -> LUT4 (the same layout and kernel, 1.22x the bytes)
    IQ2_XXS -> LUT4 (2.03x the bytes)
    IQ2_S   -> LUT4 with its 16 scales (1.68x the bytes; iq2s_lut4.py, its AVX2 kernel on every
               SIMD host: on AVX-512 VBMI + VNNI hosts too, where iq2s_avx512.py reads the GGUF
               bytes by "IQ2_S=gguf")
    IQ1_M   -> T2   (2-bit ternary codes, 1.36x the bytes; iq1_t2.py, and on AVX-512 VBMI + VNNI
               hosts iq1_t2_avx512.py unless STRATA_CPU_T2_AVX512=0: `avx512_repack_on`)
    Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0 -> AVX2 kernels on the GGUF bytes (Q4_K, Q5_K, Q6_K: on hosts
               with AVX-512 VBMI + VNNI kquants_avx512.py's, the same bits)
    IQ3_XXS -> PM instead of LUT4 on hosts with AVX-512 VBMI + VNNI (position-major, 1.04x the
               bytes; iq3_pm.py; `AVX512_REPACK_LAYOUT`); either by name: "IQ3_XXS=lut4", "pm"
    IQ1_M   -> T7 by name ("IQ1_M=t7": 7-bit ternary quads, 1.21x the bytes; iq1_t7.py, and on
               AVX-512 VBMI + VNNI hosts iq1_t7_avx512.py), or T2 by name ("IQ1_M=t2")
    F16, BF16, F32 -> portable @njit kernels only (not yet SIMD)

IQ3_XXS, IQ2_XXS and IQ1_M also have AVX2 gather kernels on the GGUF bytes (gather.py), IQ2_S
one by scalar grid loads (iq2_avx2.py): more arithmetic per weight than the repacks, fewer
bytes; on hosts with AVX-512 VBMI + VNNI, IQ3_XXS's GGUF bytes get the iq3_vbmi.py kernel
instead, IQ1_M's the iq1_avx512.py one and IQ2_S's the iq2s_avx512.py one (`gguf_kernel`;
STRATA_CPU_LAYOUT=IQ1_M=gguf picks it, "auto" keeps T2 until it is measured).
Which one "auto" takes is `AUTO_GGUF`; a layout spec picks per format:
"gguf", "repack", "auto", a layout by name (`NAMED`: "lut4", "pm", "t2", "t7"), or a comma list
whose bare item is the default and QUANT=LAYOUT items override it ("auto,IQ3_XXS=gguf");
STRATA_CPU_LAYOUT holds one.

Every transform is lossless (tests rebuild the GGUF bytes); `gguf_bytes` is what the file
holds, `nbytes` what the kernel reads, so bandwidth can be reported either way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.cpu.kernels import dispatch as K
from strata.cpu.kernels import iq1_t2, iq1_t7, iq2s_lut4, iq3_pm, lut4
from strata.cpu.kernels.simd import avx512_enabled, simd_enabled
from strata.cpu.quantize import act_code
from strata.quant.formats import QT, fmt


def _pm_kernel(simd: bool) -> int:
    return K.K_IQ3_XXS_PM_AVX512 if avx512_enabled(simd) else K.K_IQ3_XXS_PM


def _lut4_kernel(simd: bool) -> int:
    return K.K_IQ3_XXS_LUT4_AVX2 if simd else K.K_IQ3_XXS_LUT4


def _iq2s_lut4_kernel(simd: bool) -> int:
    return K.K_IQ2_S_LUT4_AVX2 if simd else K.K_IQ2_S_LUT4


def _t7_kernel(simd: bool) -> int:
    return K.K_IQ1_M_T7_AVX512 if avx512_enabled(simd) else K.K_IQ1_M_T7


def _t2_kernel(simd: bool) -> int:
    if avx512_enabled(simd) and avx512_repack_on():
        return K.K_IQ1_M_T2_AVX512
    return K.K_IQ1_M_T2_AVX2 if simd else K.K_IQ1_M_T2


# layouts a spec may name ("IQ3_XXS=pm"; a bare name applies to the formats that have it, the
# others take "auto"): (repack, the kernel that reads it given `simd`)
NAMED = {
    (QT.IQ3_XXS, "pm"): (iq3_pm.repack, _pm_kernel),
    (QT.IQ3_XXS, "lut4"): (lut4.repack, _lut4_kernel),
    (QT.IQ2_S, "lut4"): (iq2s_lut4.repack, _iq2s_lut4_kernel),
    (QT.IQ1_M, "t2"): (iq1_t2.repack, _t2_kernel),
    (QT.IQ1_M, "t7"): (iq1_t7.repack, _t7_kernel),
}
# "repack" on hosts with AVX-512 VBMI + VNNI (`avx512_enabled`): IQ3_XXS takes pm, whose kernel
# computes 1.3x (one core) to 1.7-1.9x (16 busy cores) as fast as the VBMI kernel on the GGUF
# bytes and reads 1.04x their bytes where LUT4 reads 1.37x (H200 host, session 8, calls BC-BD:
# bench/results/session8-h200-20261130.md)
AVX512_REPACK_LAYOUT = {QT.IQ3_XXS: "pm"}
GENERAL = ("auto", "gguf", "repack")  # layouts every format takes
LAYOUTS = GENERAL + tuple(sorted({name for _, name in NAMED}))
# formats whose SIMD kernel can read a repacked layout: (repack, kernel, layout name)
REPACKS = {
    QT.IQ3_XXS: (lut4.repack, K.K_IQ3_XXS_LUT4_AVX2, "lut4"),
    QT.IQ3_S: (lut4.repack_s, K.K_IQ3_S_LUT4_AVX2, "lut4"),
    QT.IQ2_XXS: (lut4.repack_2xxs, K.K_IQ2_XXS_LUT4_AVX2, "lut4"),
    QT.IQ2_S: (iq2s_lut4.repack, K.K_IQ2_S_LUT4_AVX2, "lut4"),
    QT.IQ1_M: (iq1_t2.repack, K.K_IQ1_M_T2_AVX2, "t2"),
}

# formats in REPACKS whose "auto" layout is the GGUF bytes instead of the repack: none. IQ3_XXS on
# AVX-512 VBMI hosts (iq3_vbmi.py) is the candidate: on the H200's 16 Emerald Rapids cores
# (bench/results/cpu-pool-h200-16core-20261129T20*) its pool at T = 1 took 0.309 ms a layer on the
# GGUF bytes against lut4's 0.490 on one host, 0.332-0.349 against 0.315 on another: no clear
# winner, so STRATA_CPU_LAYOUT=IQ3_XXS=gguf picks it (27% fewer bytes in RAM and in a pack).
AUTO_GGUF: frozenset = frozenset()
# IQ2_S is not in it: its lut4 layer (AVX2 kernel) took 0.247 ms against 0.251 for
# iq2s_avx512.py on the GGUF bytes on the H100 lease's 16 Xeon cores, 1.25 against 1.79 ms on
# a 2-vCPU Zen 4 (bench/results/cpu-iq2s-lut4-20261207.md)


def avx512_repack_on() -> bool:
    """Whether repacked layouts get their AVX-512 kernels (`dispatch.AVX512_REPACK`: IQ1_M's T2,
    iq1_t2_avx512.py) on hosts that have the features: on by default, STRATA_CPU_T2_AVX512=0 keeps
    the AVX2 kernel (the A/B arm). On the H200's 16 Emerald Rapids cores the pool at T = 1 took
    0.197 ms a layer with it against 0.272 with the AVX2 T2 kernel (T = 8: 1.366 against 1.808;
    bench/results/session6-h200-20261130.md)."""
    return os.environ.get("STRATA_CPU_T2_AVX512", "1").strip() != "0"


def layout_for(spec: str, qtype) -> str:
    """The layout ("gguf", "repack" or a `NAMED` one) a spec gives format `qtype` (module doc)."""
    default, per = "auto", {}
    for item in (i.strip() for i in spec.split(",") if i.strip()):
        name, _, lay = item.rpartition("=")
        if lay not in LAYOUTS:
            raise ValueError(f"unknown layout {lay!r} in {spec!r} (known: {', '.join(LAYOUTS)})")
        if not name:
            default = lay
            continue
        try:
            q = fmt(name).qtype
        except (KeyError, ValueError) as err:
            raise ValueError(f"unknown quant {name!r} in layout {spec!r}") from err
        if lay not in GENERAL and (q, lay) not in NAMED:
            raise ValueError(f"{name} has no {lay!r} layout (in {spec!r})")
        per[q] = lay
    lay = per.get(qtype, default)
    if lay not in ("gguf", "repack") and (qtype, lay) not in NAMED:  # "auto", or not this one's
        return "gguf" if qtype in AUTO_GGUF else "repack"
    return lay


def gguf_kernel(qtype, simd: bool = True) -> int:
    """The kernel code that reads format `qtype`'s GGUF bytes: the AVX-512 one where the host
    has it (`avx512_enabled`), else the AVX2 one, else (or with simd False) the portable one."""
    if avx512_enabled(simd) and qtype in K.AVX512_GGUF:
        return K.AVX512_GGUF[qtype]
    if simd and qtype in K.SIMD_GGUF:
        return K.SIMD_GGUF[qtype]
    return K.PORTABLE[qtype]


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
    layout: str  # "gguf" or a repack's name ("lut4", "t2", "t7", "pm")
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
        if self.layout == "lut4":
            unpack = {
                QT.IQ3_S: lut4.unpack_s,
                QT.IQ2_XXS: lut4.unpack_2xxs,
                QT.IQ2_S: iq2s_lut4.unpack,
            }.get(self.qtype, lut4.unpack)
            return unpack(self.data)
        if self.layout == "t2":
            return iq1_t2.unpack(self.data)
        if self.layout == "t7":
            return iq1_t7.unpack(self.data)
        if self.layout == "pm":
            return iq3_pm.unpack(self.data)
        return self.data


def prepare(
    qtype, shape, data, layout: str | None = None, simd: bool | None = None
) -> ExpertMatrix:
    """An `ExpertMatrix` from a GGUF expert tensor: type, numpy shape [E, R, C] and raw bytes.

    layout (a spec, see `layout_for`): "repack" repacks where a SIMD kernel reads a repacked
    layout; "gguf" keeps the file's bytes (and the kernel that reads them, `gguf_kernel`);
    "auto" is "repack" except for the formats in `AUTO_GGUF`. layout=None follows
    STRATA_CPU_LAYOUT (default "auto"); simd=None follows the host (`simd_enabled()`).
    """
    f = fmt(qtype)
    want = layout_for(layout or os.environ.get("STRATA_CPU_LAYOUT", "auto"), f.qtype)
    if len(shape) != 3:
        raise ValueError(f"an expert tensor has shape [E, R, C], got {list(shape)}")
    e, r, c = (int(s) for s in shape)
    if c % 256 and f.vec_dot == QT.Q8_K:
        raise ValueError(f"{f.name}: input length {c} is not a multiple of 256")
    raw = np.asarray(data).view(np.uint8).reshape(e * r, f.row_bytes(c))
    simd = simd_enabled() if simd is None else simd
    qt = f.qtype
    kernel, lay = gguf_kernel(qt, simd), "gguf"
    if want == "repack" and qt in AVX512_REPACK_LAYOUT and avx512_enabled(simd):
        want = AVX512_REPACK_LAYOUT[qt]
    if (qt, want) in NAMED:
        repack, kernel_for = NAMED[(qt, want)]
        raw, lay, kernel = repack(raw), want, kernel_for(simd)
    elif simd and want == "repack" and qt in REPACKS:
        repack, kernel, lay = REPACKS[qt]
        raw = repack(raw)
        if avx512_enabled(simd) and avx512_repack_on():  # that layout's AVX-512 kernel
            kernel = K.AVX512_REPACK.get(kernel, kernel)
    return ExpertMatrix(qt, e, r, c, raw, kernel, act_code(f.vec_dot), lay)


def prepare_tensor(t, layout: str | None = None, simd: bool | None = None) -> ExpertMatrix:
    """`prepare` for anything with `.qtype`, `.shape` and `.data` (a model's TensorRef)."""
    if isinstance(t, ExpertMatrix):
        return t
    return prepare(t.qtype, t.shape, t.data, layout, simd)
