"""Router softmax + top-k on the device (kernels/router_topk.cu): launcher; the reference is
strata.routing.route_topk."""

from __future__ import annotations

import numpy as np

from strata.gpu.rawmod import Kernels, f32, i32, ptr

MIN_WEIGHT_SUM = np.float32(6.103515625e-5)
GATINGS = {"softmax": 0, "softmax_weight": 1}  # ModelArgs.gating -> router_topk.cu's RT_*


def router_topk(
    K: Kernels, logits, t: int, e: int, k: int, renorm: bool, ids, weights,
    slot_row=None, pair_slot=None, pair_w=None, gating: str = "softmax",
) -> None:  # fmt: skip
    """ids [T, K] int32, weights [T, K] float32 from logits [T, E] (best first); with slot_row
    (a layer's expert -> slot table) also the pair list pair_slot = slot_row[ids], pair_w =
    weights, in the same launch. gating: the model's (ModelArgs.gating), as
    strata.routing.topk.route."""
    if k > e or e > 32 * K.warp or k > K.warp:
        raise ValueError(f"router top-{k} of {e} experts is not supported on the device")
    K.fn("router_topk.cu", "router_topk")(
        (t,),
        (K.warp,),
        (
            logits,
            i32(e),
            i32(k),
            i32(int(renorm)),
            f32(MIN_WEIGHT_SUM),
            ids,
            weights,
            ptr(slot_row),
            ptr(pair_slot),
            ptr(pair_w),
            i32(GATINGS[gating]),
        ),  # fmt: skip
    )
