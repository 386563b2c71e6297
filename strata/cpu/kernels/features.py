"""The host's CPU features and which kernel class the pool takes on it.

Three classes: AVX-512 VBMI + VNNI, AVX2 (with FMA and F16C), portable (plain @njit). Codegen
checks the features too: on a host without them the intrinsics emit a trap, and the dispatch
table (`strata.cpu.layout.KERNEL_TABLE`) never selects them.
"""

from __future__ import annotations

from llvmlite import binding as llb
from numba.core import config as numba_config


def host_features() -> set[str]:
    """The features Numba compiles for, as LLVM names ("avx2", "avx512vnni", ...): the host
    CPU's, or NUMBA_CPU_FEATURES ("+avx2,+fma,...") where that is set (Numba then targets those,
    so the kernels emitted must match them: e.g. AVX-512 code compiled on an AVX2 host for asm
    inspection)."""
    override = numba_config.CPU_FEATURES
    if override is not None:
        flat = override
    else:
        try:
            flat = llb.get_host_cpu_features().flatten()
        except RuntimeError:  # some platforms cannot report features
            return set()
    return {f.strip()[1:] for f in flat.split(",") if f.strip().startswith("+")}


FEATURES = host_features()
HAS_AVX2 = {"avx2", "fma", "f16c"} <= FEATURES
# what the AVX-512 kernels use: vpermi2b/vpmultishiftqb (vbmi), vpdpbusd (vnni), byte ops and
# 64-bit masks (bw), a 256-bit EVEX form (vl)
AVX512_VBMI_FEATURES = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512vnni"})
HAS_AVX512_VBMI = AVX512_VBMI_FEATURES <= FEATURES

LEVELS = ("portable", "avx2", "avx512vbmi")  # kernel classes, each a subset of the next
_cap = LEVELS[-1]


def force_level(level: str) -> None:
    """Take at most `level`'s kernels from now on, whatever the host has (tests of the AVX2 or
    portable path on a bigger host; call before any matrix is prepared)."""
    global _cap
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
    _cap = level


def simd_enabled() -> bool:
    """Whether the pool picks the SIMD kernels (AVX2 present, not forced to "portable")."""
    return HAS_AVX2 and _cap != "portable"


def avx512_enabled(simd: bool | None = None) -> bool:
    """Whether the pool picks the AVX-512 VBMI + VNNI kernels over the AVX2 ones: SIMD is on
    (simd; None: `simd_enabled()`), the host has `AVX512_VBMI_FEATURES`, no lower level forced."""
    on = simd_enabled() if simd is None else simd
    return on and HAS_AVX512_VBMI and _cap == "avx512vbmi"


def simd_level() -> str:
    if avx512_enabled():
        return "avx512vbmi"
    return "avx2" if simd_enabled() else "portable"


LEVEL_NAMES = {"avx512vbmi": "AVX-512", "avx2": "AVX2", "portable": "portable kernels"}


def level_name() -> str:
    """The kernels' level in words ("AVX2"), for messages."""
    return LEVEL_NAMES[simd_level()]
