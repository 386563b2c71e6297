"""The forward pass: drives a device tier layer by layer with the routing module in between.

Per layer: attention and the router on the device tier; top-k; in decode windows the CAR plan
(substitute resident experts for some misses); resident picks on the device tier, missed picks on
the miss runner (the CPU pool; without one, the tier emulates it), summed.

T = tokens in the step, D = hidden, E = experts, K = experts per token, V = vocab, L = layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from strata.gpu.tier import DeviceTier
from strata.model.loader import Model
from strata.routing import route_topk
from strata.routing.car import CarKnobs, car_plan
from strata.routing.profile import AdaptiveCache
from strata.routing.trace import TraceWriter


class MissRunner(Protocol):
    def experts(
        self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """Σ_k weights · expert(h) over the picks with ids >= 0 -> [T, D]."""


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
    swaps: int = 0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0

    @property
    def substitution_rate(self) -> float:
        n = self.decode_misses_before_car
        return self.substitutions / n if n else 0.0


class Engine:
    """Prefill and decode over one sequence (KV cache in the tier); `pos` is the next position."""

    def __init__(
        self,
        model: Model,
        tier: DeviceTier | None = None,
        n_ctx: int | None = None,
        resident: np.ndarray | None = None,
        car: CarKnobs | None = None,
        miss_runner: MissRunner | None = None,
        trace_path: str | None = None,
        adaptive: AdaptiveCache | None = None,
    ):
        self.model, self.args = model, model.args
        a = self.args
        if tier is None:
            from strata.gpu.host import HostTier

            tier = HostTier(model, n_ctx=n_ctx or min(a.n_ctx_train, 4096))
        self.tier = tier
        self.miss_runner = miss_runner or tier
        # a GPU tier's rows go host-ward for the pool and the pool's sum comes back
        pool = miss_runner is not None
        self._to_host = getattr(tier, "to_host", np.asarray) if pool else (lambda a: a)
        self._to_device = getattr(tier, "to_device", None) if pool else None
        # which experts the device tier holds: [L, E]; default all (a fully resident model)
        if resident is None:
            resident = np.ones((a.n_layer, a.n_expert), bool)
        self.resident = resident  # shared with `adaptive`, which swaps in place
        self.car = car  # None = CAR not wired at all
        self.adaptive = adaptive  # swaps experts into self.resident during decode
        self.trace = (
            TraceWriter(trace_path, a.n_layer, a.n_expert, a.n_expert_used) if trace_path else None
        )
        self.pos = 0
        self.stats = EngineStats(expert_hist=np.zeros((a.n_layer, a.n_expert), np.int64))

    @property
    def n_ctx(self) -> int:
        return self.tier.n_ctx

    def reset(self, keep: int = 0) -> None:
        """Forget the sequence past `keep` positions (the KV rows beyond are overwritten later)."""
        self.pos = min(self.pos, keep)

    def _moe(self, i: int, h: np.ndarray, logits: np.ndarray, decode: bool) -> np.ndarray:
        a, st = self.args, self.stats
        ids, weights, probs = route_topk(logits, a.n_expert_used, a.norm_topk)  # [T, K], [T, E]
        np.add.at(st.expert_hist[i], ids.ravel(), 1)
        if self.trace is not None:
            self.trace.write(self.pos, i, ids, probs, decode)
        resident = self.resident[i]  # [E]
        router_ids = ids
        car = self.car
        if decode and car is not None and self.stats.decode_steps >= car.warmup:
            plan = car_plan(ids, probs, resident, car)
            st.decode_misses_before_car += plan.misses
            st.substitutions += int(plan.substituted.sum())
            st.ratio_sum += float(plan.ratios.sum())
            ids = plan.ids
        elif decode:
            st.decode_misses_before_car += int((~resident[ids]).sum())
        if decode and self.adaptive is not None:
            self.stats.swaps += len(self.adaptive.observe(i, router_ids))
        hit = resident[ids]  # [T, K]
        n_hit = int(hit.sum())
        st.hits += n_hit
        st.misses += hit.size - n_hit
        if n_hit == hit.size:
            return self.tier.experts(i, h, ids, weights)
        # misses: x rows go host-ward once, the pool's sum comes back to the tier's device
        y = self.miss_runner.experts(i, self._to_host(h), np.where(hit, -1, ids), weights)
        if self._to_device is not None:
            y = self._to_device(y)
        if n_hit:
            y = y + self.tier.experts(i, h, np.where(hit, ids, -1), weights)
        return y

    def forward(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Run `tokens` at positions pos..; logits [V] of the last token ([T, V] if all_logits)."""
        a, tier = self.args, self.tier
        ids = np.asarray(tokens, dtype=np.int64)  # [T]
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("forward needs a non-empty 1-D list of token ids")
        if ids.min() < 0 or ids.max() >= a.n_vocab:
            raise ValueError(f"token id out of range 0..{a.n_vocab - 1}")
        if self.pos + ids.size > self.n_ctx:
            raise ValueError(f"context full: {self.pos + ids.size} tokens > n_ctx {self.n_ctx}")
        decode = ids.size == 1 and self.pos > 0
        x = tier.embed(ids)  # [T, D]
        for i in range(a.n_layer):
            x = tier.attention(i, x, self.pos)
            h, logits = tier.router(i, x)  # [T, D], [T, E]
            y = self._moe(i, h, logits, decode)
            if a.shared_ff:
                y = y + tier.shared_expert(i, h)
            x = x + y
        self.pos += ids.size
        self.stats.tokens += ids.size
        self.stats.decode_steps += decode
        if not all_logits:
            x = x[-1:]
        out = tier.output(x)  # [T or 1, V]
        return out if all_logits else out[0]

    def close(self) -> None:
        if self.trace is not None:
            self.trace.close()
            self.trace = None
