"""llama.cpp (llama-cpp-python) opened with or without its extra weight buffer types.

llama.cpp repacks weights into CPU-specific layouts ("extra buffer types": the AMX tiles on a CPU
with amx_int8, interleaved rows elsewhere) unless `llama_model_params.use_extra_bufts` is off,
which llama-cpp-python's `Llama` does not expose: `open_llama` sets it through the default
parameters `Llama` starts from. Off, llama.cpp's matmuls are ggml's plain vec_dot kernels (the
roundings strata's kernels copy: the oracle tests open it so). On an Intel Xeon guest with
amx_int8 the AMX buffer type made every `llama_decode` crash (SIGSEGV), so on a CPU with AMX the
llama-cpp bench arm first evaluates a few tokens of the embedded model with them on in a child
process, and keeps them only if that exits cleanly (`--peer-extra-bufts auto`, the default;
1 on, 0 off without the probe).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from strata.bench.common import EMBEDDED_MODEL

MODES = ("auto", "1", "0")
# a child that opens the embedded model with the extra buffer types on and evaluates 4 tokens
_PROBE = (
    "import llama_cpp; "
    f"m = llama_cpp.Llama(model_path={str(EMBEDDED_MODEL)!r}, n_ctx=32, n_threads=1, "
    "verbose=False); m.eval(m.tokenize(b'def f(x):', add_bos=True))"
)


def host_has_amx(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """The host CPU reports AMX int8 tiles (Linux flags; False where that cannot be read)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return "amx_int8" in flags.split()


def extra_bufts_survive(timeout_s: float = 120.0) -> bool:
    """The probe child (`_PROBE`) exits cleanly: llama.cpp's extra buffer types work here."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def peer_extra_bufts(
    mode: str = "auto", cpuinfo: str | Path = "/proc/cpuinfo", probe=extra_bufts_survive
) -> bool:
    """`--peer-extra-bufts`: "1" on, "0" off, "auto" (default): on, but on a CPU with AMX only
    if `probe()` says they survive an eval."""
    v = mode.strip()
    if v not in MODES:
        raise ValueError(f"--peer-extra-bufts {v!r}: auto, 0 or 1 expected")
    if v != "auto":
        return v == "1"
    return not host_has_amx(cpuinfo) or probe()


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
