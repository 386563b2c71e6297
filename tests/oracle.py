"""How two forward passes are compared.

Both sides quantize activations to Q8 before every quantized matmul, as llama.cpp does. A value
that lands within float32 noise of a rounding boundary can round one way on one side and the
other way on the other (a "flip"): one quant step in one element, about 1e-3 of the logits, and
through attention it reaches every later position. Flips are rare, so the statement we test is:
most positions agree to `tol` (the roundings are copied), and none is off by more than a flip.
A router near-tie that picks another expert on one side is larger than a flip: positions from the
first one where the two sides routed apart are left out of both statements.
"""

from __future__ import annotations

import numpy as np

FLIP_BOUND = 0.15  # a flipped Q8 rounding and what attention carries of it


def position_errors(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Per position: max |ours - theirs| / max |theirs| over the vocab. [T]"""
    return np.abs(ours - theirs).max(axis=-1) / np.abs(theirs).max()


def routed_apart(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    """[T] bool: positions at or after the first token that some layer routed to other experts.
    a, b: per layer, the chosen ids [T, K] of the two sides."""
    t = a[0].shape[0]
    differs = np.zeros(t, bool)
    for ia, ib in zip(a, b, strict=True):
        differs |= (np.sort(ia, axis=1) != np.sort(ib, axis=1)).any(axis=1)
    first = int(np.argmax(differs)) if differs.any() else t
    return np.arange(t) >= first


NEAR_TIE = 0.1  # router-logit gap a flip's cascade can close (flips move logits ~1e-2 relative)


def near_tie_onward(margins: list[np.ndarray]) -> np.ndarray:
    """[T] bool: positions at or after the first token whose routing nearly tied in some layer,
    where a side we cannot observe (llama.cpp) may have picked another expert."""
    close = np.min(np.stack(margins), axis=0) < NEAR_TIE  # [T]
    first = int(np.argmax(close)) if close.any() else close.size
    return np.arange(close.size) >= first


def trace_ids(path, n_layer: int, steps: slice = slice(None)) -> list[np.ndarray]:
    """Per layer, the router's ids [T, K] recorded in an STRCS1 trace, in position order."""
    from strata.routing.trace import read_trace

    _, rec = read_trace(path)
    out = []
    for layer in range(n_layer):
        r = rec[rec["layer"] == layer]
        out.append(r["ids"][np.argsort(r["step"], kind="stable")][steps])
    return out


def llama_cpu_flags(llama_cpp) -> set[str]:
    """The CPU features llama.cpp's build reports as on (AVX2, FMA, F16C, AVX512, LLAMAFILE...)."""
    info = llama_cpp.llama_print_system_info().decode()
    return {k.strip() for k, v in (f.split("=") for f in info.split("|") if "=" in f) if "1" in v}


def simd_lanes(llama_cpp) -> int:
    """float32 lanes of llama.cpp's CPU matmul kernels: the `lanes` the reference copies."""
    return 16 if "AVX512" in llama_cpu_flags(llama_cpp) else 8


def float_matmuls_copied(llama_cpp) -> bool:
    """Whether the reference's float32 matmul order (ggml_dot) is the one this llama.cpp build
    runs: x86 AVX2 + FMA + F16C with llamafile's tinyBLAS, where it was checked bit for bit."""
    flags = llama_cpu_flags(llama_cpp)
    return {"AVX2", "FMA", "F16C", "LLAMAFILE"} <= flags and "AVX512" not in flags


def assert_logits_match(
    errs: np.ndarray, tol: float, min_frac: float = 0.6, apart: np.ndarray | None = None
) -> None:
    errs = np.asarray(errs).ravel()
    # positions from a near tie / routing split on (`apart`) may differ by more than a flip:
    # both statements are about the others
    same = errs if apart is None else errs[~np.asarray(apart).ravel()]
    if not same.size:
        return
    frac = float((same <= tol).mean())
    assert frac >= min_frac, (
        f"only {frac:.0%} of {same.size} positions within {tol:g}: {np.sort(same)[::-1][:8]}"
    )
    worst = float(same.max())
    assert worst <= FLIP_BOUND, f"a position is off by {worst:.3g}, more than a Q8 flip"


def plain_llama(llama_cpp, **kwargs):
    """llama_cpp.Llama(**kwargs) with llama.cpp's extra weight buffer types off
    (strata/bench/llama_open.py): the oracle's matmuls are ggml's plain vec_dot kernels, the
    roundings our kernels copy, not a CPU's repacked or AMX forms (which crashed llama_decode
    on an AMX guest)."""
    from strata.bench.llama_open import open_llama

    return open_llama(llama_cpp, False, **kwargs)
