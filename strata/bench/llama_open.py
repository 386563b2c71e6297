"""llama.cpp (llama-cpp-python) opened with or without its extra weight buffer types.

llama.cpp repacks weights into CPU-specific layouts ("extra buffer types": the AMX tiles on a CPU
with amx_int8, interleaved rows elsewhere) unless `llama_model_params.use_extra_bufts` is off,
which llama-cpp-python's `Llama` does not expose: `open_llama` sets it through the default
parameters `Llama` starts from. Off, llama.cpp's matmuls are ggml's plain vec_dot kernels (the
roundings strata's kernels copy: the oracle tests open it so). On an Intel Xeon guest with
amx_int8 (2026-12-02) the AMX buffer type made every `llama_decode` crash (SIGSEGV), so the
llama-cpp bench arm turns them off on such CPUs unless told otherwise
(`STRATA_PEER_EXTRA_BUFTS`: auto, 1, 0).
"""

from __future__ import annotations

import os
from pathlib import Path


def host_has_amx(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """The host CPU reports AMX int8 tiles (Linux flags; False where that cannot be read)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return "amx_int8" in flags.split()


def peer_extra_bufts(env: dict | None = None, cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """STRATA_PEER_EXTRA_BUFTS: "1" on, "0" off, "auto" (default) on unless the CPU has AMX."""
    v = (os.environ if env is None else env).get("STRATA_PEER_EXTRA_BUFTS", "auto").strip()
    if v not in ("auto", "0", "1"):
        raise ValueError(f"STRATA_PEER_EXTRA_BUFTS={v!r}: auto, 0 or 1 expected")
    return not host_has_amx(cpuinfo) if v == "auto" else v == "1"


def open_llama(llama_cpp, extra_bufts: bool, **kwargs):
    """llama_cpp.Llama(**kwargs), its extra weight buffer types on or off."""
    if extra_bufts:
        return llama_cpp.Llama(**kwargs)
    lib = llama_cpp.llama.llama_cpp
    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params
    try:
        return llama_cpp.Llama(**kwargs)
    finally:
        lib.llama_model_default_params = default
