"""How two forward passes are compared.

Both sides quantize activations to Q8 before every quantized matmul, as llama.cpp does. A value
that lands within float32 noise of a rounding boundary can round one way on one side and the
other way on the other (a "flip"): one quant step in one element, about 1e-3 of the logits, and
through attention it reaches every later position. Flips are rare, so the statement we test is:
most positions agree to `tol` (the roundings are copied), and none is off by more than a flip.
"""

from __future__ import annotations

import numpy as np

FLIP_BOUND = 0.15  # a flipped Q8 rounding, or a router near-tie picking another expert


def position_errors(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Per position: max |ours - theirs| / max |theirs| over the vocab. [T]"""
    return np.abs(ours - theirs).max(axis=-1) / np.abs(theirs).max()


def assert_logits_match(errs: np.ndarray, tol: float, min_frac: float = 0.6) -> None:
    errs = np.asarray(errs).ravel()
    frac = float((errs <= tol).mean())
    assert frac >= min_frac, (
        f"only {frac:.0%} of positions within {tol:g}: {np.sort(errs)[::-1][:8]}"
    )
    assert errs.max() <= FLIP_BOUND, f"a position is off by {errs.max():.3g}, more than a Q8 flip"
