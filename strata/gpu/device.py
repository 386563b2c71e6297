"""Device discovery: CuPy on CUDA or ROCm, imported lazily; the primary device; the arch check.

`primary_device()` returns a `DeviceInfo` for the card the engine runs on, or None where there is
no usable GPU (no CuPy, no driver, no device): the engine then uses the host tier, and says so
once. Its `index` (EngineConfig.primary_device) picks the visible ordinal; it is applied before
any context or allocation exists on another device (this module makes the first CUDA/HIP call of
the process that touches a device). Code here is written for any number of devices; helper-device
caches use the ordinals other than the primary one (`other_devices`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType

# NVIDIA: compute capability 8.0+ (Ampere and newer: the kernels' dp4a and occupancy targets)
MIN_CUDA_CC = 80
# AMD: RDNA3 validated; RDNA2 builds and runs the portable dp4a fallback, unvalidated
VALIDATED_GFX = ("gfx1100", "gfx1101")
UNVALIDATED_GFX = ("gfx1030", "gfx1031", "gfx1032", "gfx1034")

_said: set[str] = set()


def say_once(msg: str) -> None:
    """Print a notice to stderr once per process (refusals and downgrades are said once)."""
    if msg not in _said:
        _said.add(msg)
        print(f"strata: {msg}", file=sys.stderr)


class DeviceError(RuntimeError):
    """A device that exists but cannot be used (bad ordinal, unsupported architecture)."""


@dataclass(frozen=True)
class DeviceInfo:
    index: int  # visible ordinal
    name: str
    backend: str  # "cuda" | "rocm"
    arch: str  # "sm_90", "gfx1101", ...
    warp_size: int
    total_bytes: int
    sm_count: int
    validated: bool

    def describe(self) -> str:
        v = "" if self.validated else ", unvalidated"
        return (
            f"GPU {self.index}: {self.name} ({self.backend} {self.arch}, warp {self.warp_size}, "
            f"{self.total_bytes / 2**30:.1f} GiB{v})"
        )


def import_cupy() -> ModuleType | None:
    """CuPy, or None when it is not installed or cannot load its CUDA/HIP runtime."""
    try:
        import cupy
    except Exception:  # ImportError, or a runtime library that fails to load
        return None
    return cupy


def _decode(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _arch(props: dict, is_hip: bool) -> str:
    if is_hip:
        return _decode(props.get("gcnArchName", "")).split(":")[0] or "gfx?"
    return f"sm_{int(props['major'])}{int(props['minor'])}"


def check_arch(backend: str, arch: str) -> bool:
    """True when validated; False (with a warning, once) when allowed but unvalidated; raises
    DeviceError for an architecture the kernels do not support."""
    if backend == "cuda":
        cc = int(arch.removeprefix("sm_"))
        if cc < MIN_CUDA_CC:
            raise DeviceError(
                f"NVIDIA {arch} is not supported: Strata's kernels need compute capability "
                f"8.0 or newer (Ampere+)"
            )
        return True
    if arch in VALIDATED_GFX:
        return True
    if arch in UNVALIDATED_GFX:
        say_once(
            f"AMD {arch} is not validated (validated: {', '.join(VALIDATED_GFX)}); "
            "running the portable kernels anyway"
        )
        return False
    raise DeviceError(
        f"AMD {arch} is not supported (validated: {', '.join(VALIDATED_GFX)}; "
        f"unvalidated: {', '.join(UNVALIDATED_GFX)})"
    )


def primary_device(index: int = 0) -> DeviceInfo | None:
    """Visible device `index`, made current: the device the engine runs on; None (said once)
    when there is no GPU."""
    n = int(index)
    if n < 0:
        raise DeviceError(f"primary device {n}: the ordinal must be 0 or more")
    cp = import_cupy()
    if cp is None:
        say_once("no GPU tier: CuPy is not installed (or cannot load); using the host tier")
        return None
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device
        say_once(f"no GPU tier: {' '.join(str(e).split())}; using the host tier")
        return None
    if count == 0:
        say_once("no GPU tier: no device is visible; using the host tier")
        return None
    if n >= count:
        raise DeviceError(
            f"primary device {n} but only {count} device(s) are visible (0..{count - 1})"
        )
    cp.cuda.Device(n).use()  # before any allocation: the pool and the modules live here
    return device_info(n)


def device_info(n: int) -> DeviceInfo:
    cp = import_cupy()
    is_hip = bool(getattr(cp.cuda.runtime, "is_hip", False))
    props = cp.cuda.runtime.getDeviceProperties(n)
    backend = "rocm" if is_hip else "cuda"
    arch = _arch(props, is_hip)
    validated = check_arch(backend, arch)
    return DeviceInfo(
        index=n,
        name=_decode(props.get("name", "?")),
        backend=backend,
        arch=arch,
        warp_size=int(props.get("warpSize", 32)),
        total_bytes=int(props.get("totalGlobalMem", 0)),
        sm_count=int(props.get("multiProcessorCount", 1)),
        validated=validated,
    )


def other_devices(primary: int) -> list[int]:
    """Visible ordinals other than the primary (for helper caches)."""
    cp = import_cupy()
    if cp is None:
        return []
    return [i for i in range(cp.cuda.runtime.getDeviceCount()) if i != primary]
