"""What an engine counted: tokens, steps, router picks, cache hits and misses, CAR
substitutions, adaptive swaps, and the time of the hybrid decode windows.

L = layers, E = experts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from strata.routing.slack import SlackMeter


@dataclass
class EngineStats:
    tokens: int = 0
    decode_steps: int = 0
    expert_hist: np.ndarray | None = field(default=None, repr=False)  # [L, E] router picks
    hits: int = 0  # picks served by resident experts (after CAR)
    misses: int = 0  # picks left to the miss runner (after CAR)
    decode_misses_before_car: int = 0
    substitutions: int = 0
    ratio_sum: float = 0.0
    subst_weight: float = 0.0  # router weight of the substituted picks (host-routed decode)
    routed_weight: float = 0.0  # router weight of every decode pick, beside it
    swaps: int = 0
    warm_swaps: int = 0  # of `swaps`: made from prompts' picks (the adaptive cache's `warm`)
    # decode windows (per layer, summed over steps; seconds): wall time of the whole layer,
    # blocked on the card, host routing (top-k, CAR, statistics), the CPU pool's call
    window_layers: int = 0
    window_s: float = 0.0
    wait_s: float = 0.0
    route_s: float = 0.0
    pool_s: float = 0.0
    graph_steps: int = 0  # decode steps replayed from CUDA graphs
    offloaded: int = 0  # prompt picks missed by the cache and run from the tier's staging slots
    slack: SlackMeter | None = field(default=None, repr=False)  # the windows' running figures
    # decode misses split between the CPU pool and the PCIe link (strata/engine/pcie_split.py):
    # windows split, distinct missed experts computed by the pool and uploaded to the card
    split_windows: int = 0
    split_pool: int = 0
    split_pcie: int = 0
    # helper cards (strata/engine/helpers.py): picks each computed; the CPU pool's distinct
    # experts summed over the decode layer-windows counted
    helper_hits: list[int] = field(default_factory=list)
    # the host-to-card path measured at start (strata/gpu/link.py): the host's gather into
    # pinned memory and the link's copy, GB/s of expert bytes (0: not measured, no card)
    gather_gbps: float = 0.0
    link_gbps: float = 0.0
    cpu_experts: int = 0
    cpu_windows: int = 0
    # speculative decoding (strata/engine/speculative.py): the trunk's decode forwards, the
    # tokens they yielded, the NextN drafts they verified and the drafts accepted
    spec_steps: int = 0
    spec_tokens: int = 0
    spec_drafted: int = 0
    spec_accepted: int = 0

    def add_window(
        self, t0: float, t1: float, t2: float, t3: float, layer: int = -1, jobs: int = 0
    ) -> None:
        """One layer's decode window: started t0, the card's result at t1, routed by t2, the
        pool done at t3 (perf_counter seconds); `jobs` missed experts went to the pool."""
        if self.slack is not None and layer >= 0:
            self.slack.observe(layer, t1 - t0, t2 - t1, t3 - t2, jobs)
        self.wait_s += t1 - t0
        self.route_s += t2 - t1
        self.pool_s += t3 - t2
        self.window_s += t3 - t0
        self.window_layers += 1

    def add_windows(self, w: np.ndarray, first: int = -1, jobs: np.ndarray | None = None) -> None:
        """Layers' decode windows at once: w [n, 3] seconds waiting, routing, in the pool, of
        layers first.. with jobs [n] missed experts each."""
        if self.slack is not None and first >= 0 and jobs is not None:
            self.slack.observe_rows(first, w, jobs)
        self.wait_s += float(w[:, 0].sum())
        self.route_s += float(w[:, 1].sum())
        self.pool_s += float(w[:, 2].sum())
        self.window_s += float(w.sum())
        self.window_layers += w.shape[0]

    def window_ms(self) -> dict[str, float]:
        """Mean per-layer decode window split: total, waiting on the card, routing, pool."""
        n = max(1, self.window_layers)
        return {k: 1e3 * getattr(self, f"{k}_s") / n for k in ("window", "wait", "route", "pool")}

    def cpu_experts_per_window(self) -> float:
        """Mean distinct experts the CPU pool computed a decode layer-window: counted where
        helper cards split the misses, else the decode misses after CAR a layer (one token a
        step: its picks are distinct)."""
        if self.cpu_windows:
            return self.cpu_experts / self.cpu_windows
        layers = 0 if self.expert_hist is None else self.expert_hist.shape[0]
        n = self.decode_steps * layers
        return (self.decode_misses_before_car - self.substitutions) / n if n else 0.0

    def split_per_window(self) -> dict[str, float]:
        """Mean missed experts a decode window sent to the pool and over PCIe."""
        n = max(1, self.split_windows)
        return {"pool": self.split_pool / n, "pcie": self.split_pcie / n}

    @property
    def acceptance(self) -> float:
        """Accepted drafts over drafted ones."""
        return self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """Tokens a speculative decode forward of the trunk yielded, on average (1 + accepted)."""
        return self.spec_tokens / self.spec_steps if self.spec_steps else 0.0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    @property
    def substituted_mass(self) -> float:
        """Share of the decode picks' router weight that CAR moved to another expert."""
        return self.subst_weight / self.routed_weight if self.routed_weight else 0.0

    @property
    def substitution_rate(self) -> float:
        n = self.decode_misses_before_car
        return self.substitutions / n if n else 0.0
