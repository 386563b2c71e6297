"""Compile every kernel source for AMD with a real HIP compiler (a CI check, no GPU needed).

    python -m strata.gpu.hip_check [--arch gfx1030 --arch gfx1100 ...] [--hipcc PATH]

Each `.cu` under strata/gpu/kernels is expanded exactly as the runtime does (strata.gpu.source)
and compiled device-only with `hipcc -x hip --offload-arch=<arch> -DSTRATA_WARP=<32|64>`,
HIP_PLATFORM=amd (else hipcc picks nvcc), with hip_runtime.h force-included as hipRTC does.
Debian 12's `hipcc` + `rocm-device-libs` (ROCm 5.2) build gfx1030 (RDNA2, wave32) and gfx90a
(CDNA2, wave64: checks that nothing assumes a 32-wide warp); their device libraries stop short
of gfx110x: those targets are then compiled to ISA without the device-library link
(`-nogpulib -S`), which checks the source, the builtins (RDNA3's v_dot4 through
__builtin_amdgcn_sudot4) and code generation, but not the link against libm/ockl. Exit status 1
when any target fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from strata.gpu.source import SOURCES, expand

DEFAULT_ARCHS = ("gfx1030", "gfx1100", "gfx1101", "gfx90a")
WAVE64 = ("gfx90a", "gfx90c", "gfx908", "gfx940", "gfx941", "gfx942")
NO_DEVICE_LIB = "cannot find ROCm device library"


def compile_one(
    hipcc: str, src: Path, arch: str, out: Path, isa_only: bool = False
) -> subprocess.CompletedProcess:
    warp = 64 if arch in WAVE64 else 32
    cmd = [
        hipcc, "-x", "hip", "-std=c++17", f"--offload-arch={arch}", "--offload-device-only",
        f"-DSTRATA_WARP={warp}", "-include", "hip/hip_runtime.h", str(src), "-o", str(out),
    ]  # fmt: skip
    cmd += ["-nogpulib", "-S"] if isa_only else ["-c"]
    env = dict(os.environ, HIP_PLATFORM="amd")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata.gpu.hip_check", description=__doc__)
    ap.add_argument("--arch", action="append", help="offload arch (repeatable)")
    ap.add_argument("--hipcc", default=shutil.which("hipcc") or "hipcc")
    ns = ap.parse_args(argv)
    archs = ns.arch or list(DEFAULT_ARCHS)
    if not shutil.which(ns.hipcc):
        print(f"hip_check: no hipcc ({ns.hipcc}); apt-get install hipcc rocm-device-libs")
        return 2
    failed, checked, skipped = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in SOURCES:
            src = Path(tmp) / name.replace(".cu", ".hip")
            src.write_text(expand(name))
            for arch in archs:
                r = compile_one(ns.hipcc, src, arch, Path(tmp) / "out.o")
                status = "ok"
                if r.returncode and NO_DEVICE_LIB in r.stderr:
                    r = compile_one(ns.hipcc, src, arch, Path(tmp) / "out.s", isa_only=True)
                    status = "ok to ISA (no device library for it in this ROCm: link not checked)"
                    if r.returncode == 0:
                        skipped.append((arch, name))
                if r.returncode == 0:
                    checked.append((arch, name))
                else:
                    failed.append((arch, name))
                    status = "FAILED\n" + r.stderr[-3000:]
                print(f"{arch:8} {name:16} {status}")
    ver = subprocess.run([ns.hipcc, "--version"], capture_output=True, text=True).stdout
    print(f"hipcc: {ver.splitlines()[0] if ver else '?'}")
    ok_archs = sorted({a for a, _ in checked})
    isa = sorted({a for a, _ in skipped})
    print(f"compiled: {', '.join(ok_archs) or 'none'} (of which to ISA only, no device-library "
          f"link: {', '.join(isa) or 'none'}); failures: {len(failed)}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
