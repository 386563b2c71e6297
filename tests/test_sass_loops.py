"""scripts/sass_loops.py's reading of cuobjdump text: functions, backward branches as loops, and
opcodes without predicates or modifiers (the build itself needs nvcc and cuobjdump)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "sass_loops", Path(__file__).resolve().parent.parent / "scripts" / "sass_loops.py"
)
sl = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(sl)

SASS = """
        code for sm_90
                Function : kern_a
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                  /* 0x00000a00ff017b82 */
        /*0010*/                   IMAD.WIDE.U32 R2, R4, 0x4, R6 ;         /* 0x0000000404027825 */
        /*0020*/                   LDG.E R0, desc[UR6][R2.64] ;            /* 0x0000000602007981 */
        /*0030*/                   IADD3 R4, R4, 0x1, RZ ;                 /* 0x0000000104047810 */
        /*0040*/                   ISETP.GE.AND P0, PT, R4, R5, PT ;       /* 0x000000050400720c */
        /*0050*/              @!P0 BRA 0x10 ;                              /* 0xfffffffc00ec8947 */
        /*0060*/               @P1 BRA 0x80 ;                              /* 0x0000000000041947 */
        /*0070*/                   EXIT ;                                  /* 0x000000000000794d */
                ..........
                Function : kern_b
        /*0000*/                   EXIT ;                                  /* 0x000000000000794d */
"""


def test_functions_loops_and_opcodes():
    funcs = sl.functions(SASS)
    assert list(funcs) == ["kern_a", "kern_b"]
    assert len(funcs["kern_a"]) == 8 and len(funcs["kern_b"]) == 1
    ((start, end, body),) = sl.loops(funcs["kern_a"])  # the forward branch is no loop
    assert (start, end, len(body)) == (0x10, 0x50, 5)
    assert [sl.opcode(t) for t in body] == ["IMAD", "LDG", "IADD3", "ISETP", "BRA"]
    assert sl.loops(funcs["kern_b"]) == []
