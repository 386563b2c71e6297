"""Router softmax + top-k on the device (kernels/router_topk.cu): launcher; the reference is
strata.routing.route_topk."""

from __future__ import annotations

import numpy as np

from strata.gpu.rawmod import Kernels, f32, i32

MIN_WEIGHT_SUM = np.float32(6.103515625e-5)


def router_topk(K: Kernels, logits, t: int, e: int, k: int, renorm: bool, ids, weights) -> None:
    """ids [T, K] int32, weights [T, K] float32 from logits [T, E] (best first)."""
    if k > e or e > 32 * K.warp:
        raise ValueError(f"router top-{k} of {e} experts is not supported on the device")
    K.fn("router_topk.cu", "router_topk")(
        (t,),
        (K.warp,),
        (logits, i32(e), i32(k), i32(int(renorm)), f32(MIN_WEIGHT_SUM), ids, weights),
    )
