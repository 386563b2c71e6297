"""Routing: top-k, cache-aware routing (CAR), usage profiles, traces: each rule in NumPy beside
its Numba twin. Imports only the standard library, NumPy, Numba and itself."""

from strata.routing.topk import MIN_WEIGHT_SUM, route_topk, softmax

__all__ = ["MIN_WEIGHT_SUM", "route_topk", "softmax"]
