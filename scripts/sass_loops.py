"""The SASS of a kernel source's functions, without a GPU: each loop's instruction count and mix.

    python scripts/sass_loops.py gemv.cu gemv1w_iq3_xxs gemv1w_q4_k
    python scripts/sass_loops.py gemv.cu gemv1w_iq3_xxs -D STRATA_SIGN_SPREAD=0 --arch sm_90
    python scripts/sass_loops.py experts_mma.cu moe_gate_up_mma_iq3_xxs --print

Expands the source as the engine does (`strata.gpu.source.expand`), builds a cubin with nvcc
(`-DSTRATA_WARP=32` and the -D knobs given), disassembles it with cuobjdump and prints, for each
named function (a substring matches), every loop (a backward branch and its target) with its
instruction count and the most frequent opcodes; `--print` also lists the loops' instructions.
nvcc comes with the CUDA toolkit; cuobjdump (and nvdisasm) also come as PyPI wheels
(`pip download nvidia-cuda-cuobjdump`, then put the wheel's `nvidia/cu13/bin` on PATH). Session 20
sized its decode changes so (bench/results/session20-h200-20261202.md): the counts are what the
card issues per trip, not its time.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

_FUNC = re.compile(r"\n\s*Function : ")
_INSTR = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;")
_BRA = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?(0x[0-9a-f]+)")
_PRED = re.compile(r"^@!?U?P\w+\s+")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """cuobjdump -sass text -> {function name: [(address, instruction), ...]}."""
    out = {}
    for part in _FUNC.split(sass)[1:]:
        name = part.split("\n", 1)[0].strip()
        out[name] = [(int(a, 16), t) for a, t in _INSTR.findall(part)]
    return out


def opcode(instr: str) -> str:
    """An instruction's opcode without its predicate and modifiers (IMAD.WIDE.U32 -> IMAD)."""
    return _PRED.sub("", instr).split()[0].split(".")[0]


def loops(instrs: list[tuple[int, str]]) -> list[tuple[int, int, list[str]]]:
    """Every backward branch as (target address, branch address, the instructions between)."""
    index = {a: i for i, (a, _) in enumerate(instrs)}
    found = []
    for i, (addr, text) in enumerate(instrs):
        m = _BRA.search(text)
        if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in index:
            j = index[int(m.group(1), 16)]
            found.append((instrs[j][0], addr, [t for _, t in instrs[j : i + 1]]))
    return found


def build_sass(source: str, defines: list[str], arch: str) -> str:
    from strata.gpu.source import expand

    for tool in ("nvcc", "cuobjdump"):
        if shutil.which(tool) is None:
            raise SystemExit(f"sass_loops: {tool} is not on PATH (see this script's docstring)")
    with tempfile.TemporaryDirectory() as d:
        cu, cubin = Path(d) / "k.cu", Path(d) / "k.cubin"
        cu.write_text(expand(source))
        cmd = ["nvcc", f"-arch={arch}", "-cubin", "-O3", "-DSTRATA_WARP=32"]
        cmd += [f"-D{x}" for x in defines] + ["-o", str(cubin), str(cu)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"sass_loops: nvcc failed:\n{r.stderr[-2000:]}")
        r = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"sass_loops: cuobjdump failed: {r.stderr.strip()}")
        return r.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", help="a kernel source under strata/gpu/kernels (e.g. gemv.cu)")
    ap.add_argument("functions", nargs="+", help="function names (substrings match)")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=V]")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--print", action="store_true", help="also list the loops' instructions")
    a = ap.parse_args(argv)
    from strata.gpu.source import SOURCES

    if a.source not in SOURCES:
        raise SystemExit(f"sass_loops: {a.source!r} is not a kernel source ({', '.join(SOURCES)})")
    funcs = functions(build_sass(a.source, a.defines, a.arch))
    shown = 0
    for name, instrs in funcs.items():
        if not any(p in name for p in a.functions):
            continue
        shown += 1
        print(f"{name}: {len(instrs)} instructions")
        for start, end, body in loops(instrs):
            mix = " ".join(f"{k}:{v}" for k, v in Counter(map(opcode, body)).most_common(10))
            print(f"  loop {start:#x}-{end:#x}: {len(body)} {mix}")
            if a.print:
                for t in body:
                    print(f"    {t}")
    if not shown:
        raise SystemExit(f"sass_loops: no function of {a.source} matches {a.functions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
