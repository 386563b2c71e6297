"""Routing + cache-aware routing on the device (kernels/route_car.cu): launcher. The reference
is strata.routing: route_topk for the picks, car_plan for the substitutions (on the probs the
kernel writes out, the rule gives the same plan).

T = tokens, E = experts, K = picks per token.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.rawmod import Kernels, f32, i32
from strata.routing.topk import MIN_WEIGHT_SUM

MAX_K = 16
MAX_PER_LANE = 8


def route_car_supported(K: Kernels, e: int, k: int) -> bool:
    return k <= MAX_K and k <= e <= MAX_PER_LANE * K.warp


def route_car(
    K: Kernels, logits, t: int, e: int, k: int, renorm: bool, slot_row, knobs, out: dict
) -> None:
    """out: probs [T, E] f32, ids0/ids/pair_slot [T, K] i32, weights [T, K] f32, stats [T, 4]
    f32 (misses before CAR, substitutions, misses after, sum of ratios). knobs [4] float64 on
    the device: threshold, budget, free_ratio, on. slot_row [E] i32 (-1: not resident)."""
    if not route_car_supported(K, e, k):
        raise ValueError(f"device routing of top-{k} of {e} experts is not supported")
    K.fn("route_car.cu", "route_car")(
        (t,),
        (K.warp,),
        (
            logits,
            i32(e),
            i32(k),
            i32(int(renorm)),
            f32(MIN_WEIGHT_SUM),
            slot_row,
            knobs,
            out["probs"],
            out["ids0"],
            out["ids"],
            out["weights"],
            out["pair_slot"],
            out["stats"],
        ),
    )


def knob_values(threshold: float, budget: int, free_ratio: float, on: bool) -> np.ndarray:
    return np.array([threshold, budget, free_ratio, 1.0 if on else 0.0], np.float64)
