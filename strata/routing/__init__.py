"""Routing: top-k, cache-aware routing (CAR), usage profiles, traces. NumPy only."""

from strata.routing.topk import MIN_WEIGHT_SUM, route_topk, softmax

__all__ = ["MIN_WEIGHT_SUM", "route_topk", "softmax"]
