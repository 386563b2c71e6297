"""Compile every kernel source for AMD with a real HIP compiler (a CI check, no GPU needed).

    python -m strata.gpu.hip_check [--arch gfx1030 --arch gfx1100 ...] [--hipcc PATH] [--jobs N]

Each `.cu` under strata/gpu/kernels is expanded exactly as the runtime does (strata.gpu.source)
and compiled device-only with `hipcc -x hip --offload-arch=<arch> -DWARP_SIZE=<32|64>`,
HIP_PLATFORM=amd (else hipcc picks nvcc), with hip_runtime.h force-included as hipRTC does.
Debian 12's `hipcc` + `rocm-device-libs` (ROCm 5.2) build gfx1030 (RDNA2, wave32) and gfx90a
(CDNA2, wave64: checks that nothing assumes a 32-wide warp); their device libraries stop short
of gfx110x: those targets are then compiled to ISA without the device-library link
(`-nogpulib -S`), which checks the source, the builtins (RDNA3's v_dot4 through
__builtin_amdgcn_sudot4) and code generation, but not the link against libm/ockl. Exit status 1
when any target fails. CI runs it through tests/test_hip_compile.py (.ci/run installs Debian's
hipcc where it can).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from strata.gpu.source import SOURCES, expand

DEFAULT_ARCHS = ("gfx1030", "gfx1100", "gfx1101", "gfx90a")
WAVE64 = ("gfx90a", "gfx90c", "gfx908", "gfx940", "gfx941", "gfx942")
NO_DEVICE_LIB = "cannot find ROCm device library"


def compile_one(
    hipcc: str, src: Path, arch: str, out: Path, isa_only: bool = False
) -> subprocess.CompletedProcess:
    warp = 64 if arch in WAVE64 else 32
    # through env(1): HIP_PLATFORM=amd added to the inherited environment (else hipcc picks nvcc)
    cmd = [
        "env", "HIP_PLATFORM=amd", hipcc, "-x", "hip", "-std=c++17", f"--offload-arch={arch}",
        "--offload-device-only", f"-DWARP_SIZE={warp}", "-include", "hip/hip_runtime.h",
        str(src), "-o", str(out),
    ]  # fmt: skip
    cmd += ["-nogpulib", "-S"] if isa_only else ["-c"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def check_one(hipcc: str, src: Path, arch: str, tmp: Path) -> tuple[str, bool, bool]:
    """Compile src for arch (to ISA only where this ROCm has no device library for it) ->
    (status line, ok, isa_only)."""
    stem = f"{src.stem}-{arch}"
    r = compile_one(hipcc, src, arch, tmp / f"{stem}.o")
    isa = False
    status = "ok"
    if r.returncode and NO_DEVICE_LIB in r.stderr:
        r = compile_one(hipcc, src, arch, tmp / f"{stem}.s", isa_only=True)
        isa = True
        status = "ok to ISA (no device library for it in this ROCm: link not checked)"
    if r.returncode:
        status = "FAILED\n" + r.stderr[-3000:]
    return status, r.returncode == 0, isa


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata.gpu.hip_check", description=__doc__)
    ap.add_argument("--arch", action="append", help="offload arch (repeatable)")
    ap.add_argument("--hipcc", default=shutil.which("hipcc") or "hipcc")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiles at once")
    ns = ap.parse_args(argv)
    archs = ns.arch or list(DEFAULT_ARCHS)
    if not shutil.which(ns.hipcc):
        print(f"hip_check: no hipcc ({ns.hipcc}); apt-get install hipcc rocm-device-libs")
        return 2
    if ns.jobs < 1:
        ap.error("--jobs must be positive")
    failed, checked, skipped = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        srcs = []
        for name in SOURCES:
            src = Path(tmp) / name.replace(".cu", ".hip")
            src.write_text(expand(name))
            srcs.append((name, src))
        jobs = [(name, src, arch) for name, src in srcs for arch in archs]
        with ThreadPoolExecutor(ns.jobs) as pool:  # each job a hipcc process
            results = pool.map(lambda j: check_one(ns.hipcc, j[1], j[2], Path(tmp)), jobs)
            for (name, _, arch), (status, ok, isa) in zip(jobs, results, strict=True):
                (checked if ok else failed).append((arch, name))
                if ok and isa:
                    skipped.append((arch, name))
                print(f"{arch:8} {name:16} {status}", flush=True)
    ver = subprocess.run([ns.hipcc, "--version"], capture_output=True, text=True).stdout
    print(f"hipcc: {ver.splitlines()[0] if ver else '?'}")
    ok_archs = sorted({a for a, _ in checked})
    isa = sorted({a for a, _ in skipped})
    print(f"compiled: {', '.join(ok_archs) or 'none'} (of which to ISA only, no device-library "
          f"link: {', '.join(isa) or 'none'}); failures: {len(failed)}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
