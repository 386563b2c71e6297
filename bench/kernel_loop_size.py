"""Instructions in a CPU row kernel's block loop, compiled for Sapphire Rapids on any x86 host.

Usage: PYTHONPATH=. python bench/kernel_loop_size.py MODULE:FUNCTION:BLOCK_BYTES [...]
e.g. kquants_avx2:dot_q4_k_avx2:144 kquants_avx512:dot_q4_k_avx512:144 (modules under
strata.cpu.kernels). The asm comes from the tests' `avx512_asm` (a subprocess with its own Numba
cache, NUMBA_CPU_NAME=sapphirerapids); the loop counted is the longest one a backward `jne`
closes, without directives and comments.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from tests.test_cpu_iq3_vbmi import avx512_asm


def loop_instructions(asm: str) -> int:
    lines = asm.splitlines()
    labels = {
        m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^(\.LBB\d+_\d+):", ln))
    }
    best = 0
    for i, ln in enumerate(lines):
        m = re.match(r"^\s+jne\s+(\.LBB\d+_\d+)", ln)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)] : i + 1]
            best = max(best, sum(1 for x in body if x.startswith("\t") and x[1:2] not in ".#"))
    return best


def main() -> None:
    for spec in sys.argv[1:]:
        module, fn, bb = spec.split(":")
        asm, _ = avx512_asm(Path(tempfile.mkdtemp()), module, fn, int(bb))
        print(f"{module}.{fn}: {loop_instructions(asm)} loop instructions a block")


if __name__ == "__main__":
    main()
