"""Routing + cache-aware routing on the device (kernels/route_car.cu): launcher. The reference
is strata.routing: route_topk for the picks, car_plan for the substitutions (on the probs the
kernel writes out, the rule gives the same plan).

T = tokens, E = experts, K = picks per token.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.rawmod import NULL, Kernels, f32, host_ptr, i32, ptr
from strata.routing.topk import MIN_WEIGHT_SUM

MAX_K = 16
MAX_PER_LANE = 8


def route_car_supported(K: Kernels, e: int, k: int) -> bool:
    return k <= MAX_K and k <= e <= MAX_PER_LANE * K.warp


def pack_words(k: int, d: int) -> int:
    """32-bit words of one token's packed plan: ids0, ids, weights, pair_slot [K], stats [4],
    h [D]."""
    return 4 * k + 4 + d


def route_car(
    K: Kernels,
    logits,
    t: int,
    e: int,
    k: int,
    renorm: bool,
    slot_row,
    knobs,
    out: dict,
    pack=None,
    h=None,
    ready=None,
    step=None,
) -> None:
    """out: probs [T, E] f32, ids0/ids/pair_slot [T, K] i32, weights [T, K] f32, stats [T, 4]
    f32 (misses before CAR, substitutions, misses after, sum of ratios). knobs [N_KNOBS]
    float64 on the device (knob_values; the layer's row of layer_knobs): threshold, budget,
    free_ratio, on, max weight, misses kept for the pool. slot_row [E] i32 (-1: not resident).
    With `pack` (uint32 [T, pack_words(K, D)]) the plan and the rows h [T, D] are also written
    there as one record per token (one copy to the host). `pack` may be pinned host memory (a
    NumPy array: the card writes it over the bus); with T = 1, `ready` (pinned int32 [1]) then
    gets step[0] (int32 [1] on the card) once the record is visible to the host."""
    if not route_car_supported(K, e, k):
        raise ValueError(f"device routing of top-{k} of {e} experts is not supported")
    d = 0
    if pack is not None:
        d = int(h.shape[-1])
        if pack.dtype != np.uint32 or pack.size < t * pack_words(k, d):
            raise ValueError(f"pack must be uint32 with {t} x {pack_words(k, d)} words")
    if ready is not None and (t != 1 or not isinstance(pack, np.ndarray) or step is None):
        raise ValueError("a ready word needs one token, a pack in pinned host memory and a step")
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
            host_ptr(pack) if isinstance(pack, np.ndarray) else ptr(pack),
            ptr(h),
            i32(d),
            NULL if ready is None else host_ptr(ready),
            ptr(step),
        ),
    )


N_KNOBS = 6  # threshold, budget, free ratio, on, max weight, misses kept (route_car.cu)


def knob_values(
    threshold: float,
    budget: int,
    free_ratio: float,
    on: bool,
    max_weight: float = np.inf,
    keep: int = 0,
) -> np.ndarray:
    """One layer's knobs [N_KNOBS] float64; the defaults are the seeds' rule (CarKnobs.bounds)."""
    return np.array(
        [threshold, budget, free_ratio, 1.0 if on else 0.0, max_weight, keep], np.float64
    )


def layer_knobs(car, decode_steps: int, slack, n_layer: int) -> np.ndarray:
    """[L, N_KNOBS] of a decode step: `car` a CarKnobs or None (not wired), `slack` a
    strata.routing.slack.SlackMeter or None (no room measured), warmup counted here."""
    if car is None:
        return np.tile(knob_values(1.0, 0, 1.0, False), (n_layer, 1))
    on = car.enabled and decode_steps >= car.warmup
    out = np.tile(knob_values(car.threshold, car.budget, car.free_ratio, on), (n_layer, 1))
    if car.mode == "slack":  # CarKnobs.bounds for every layer at once (one-token steps)
        s = slack.slack[:, 0] if slack is not None else np.zeros(n_layer)  # [L] jobs
        out[:, 4] = car.max_weight
        out[:, 5] = np.where(s >= 1.0, np.floor(s), 0.0)
    return out
