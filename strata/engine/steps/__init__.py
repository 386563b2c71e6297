"""Decode steps as objects, chosen once when the engine is built (`choose_step`):

- `AllResidentGraphStep`: every expert on the card, one CUDA graph a token;
- `RoutedGraphStep`: hybrid, routed on the card, the CPU pool on the misses;
- `HostRoutedGraphStep`: hybrid, routed on the host between two graphs a layer;
- `EagerStep`: layer by layer with eager launches (the CPU-only tier, no graphs); it also runs
  every prompt;
- `HostStep` (host.py): the CPU-only tier's decode token in one compiled call, where every expert
  runs in the CPU pool (the engine takes it over `EagerStep` for decode; `HostStep.build`).
"""

from __future__ import annotations

from strata.cpu.runner import PoolMissRunner
from strata.engine.moe import MissRunner
from strata.engine.steps.all_resident import AllResidentGraphStep
from strata.engine.steps.eager import EagerStep
from strata.engine.steps.host_routed import HostRoutedGraphStep
from strata.engine.steps.routed import RoutedGraphStep
from strata.engine.tier import Tier

__all__ = [
    "AllResidentGraphStep",
    "EagerStep",
    "HostRoutedGraphStep",
    "RoutedGraphStep",
    "graph_step_kind",
    "step_server_of",
]


def graph_step_kind(
    tier: Tier,
    card: bool,
    graphs: bool,
    miss_runner: MissRunner,
    traced: bool,
    adaptive: bool,
    device_routing: bool,
) -> str | None:
    """Which graph step decodes on this tier: "all", "routed", "hybrid", or None (eager).

    "all" where the host needs nothing per layer; "routed" where the card can route (no trace
    asks for the host's scores); "hybrid" otherwise; eager without graphs, off the card, or
    where the tier itself serves the misses by uploading experts on demand."""
    if not graphs or not card:
        return None
    if tier.all_resident and not traced and not adaptive:
        return "all"
    if miss_runner is not tier or tier.all_resident:
        if device_routing and not traced and tier.routes_on_device():
            return "routed"
        return "hybrid"
    return None


def step_server_of(miss_runner: MissRunner):
    """The miss runner's `step_server` where it has one (the CPU pool), else None."""
    return miss_runner.step_server if isinstance(miss_runner, PoolMissRunner) else None
