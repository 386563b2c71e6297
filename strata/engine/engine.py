"""The engine: prefill and decode over one sequence on a tier, with the routing module between
the tier's router and its experts.

Per layer: attention and the router on the tier; top-k; in decode windows the CAR plan
(substitute resident experts for some misses); resident picks on the tier, missed picks on the
miss runner (the CPU pool; without one, the tier serves them), summed. How a decode step runs is
an object chosen once here (strata/engine/steps): from CUDA graphs on a card, else eagerly.

T = tokens in the step, D = hidden, E = experts, K = experts per token, V = vocab, L = layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strata.engine.moe import MissRunner, Moe
from strata.engine.stats import EngineStats
from strata.engine.steps import (
    AllResidentGraphStep,
    EagerStep,
    HostRoutedGraphStep,
    RoutedGraphStep,
    graph_step_kind,
    step_server_of,
)
from strata.engine.tier import Tier, is_card
from strata.gpu.sample import SampleKnobs
from strata.model.loader import Model
from strata.routing.car import CarKnobs
from strata.routing.profile import AdaptiveCache
from strata.routing.slack import SlackMeter
from strata.routing.trace import TraceWriter


class Engine:
    """Prefill and decode over one sequence (KV cache in the tier); `pos` is the next position.

    tier: None = the CPU-only tier; resident [L, E]: the experts the tier holds (default all);
    miss_runner: where the others run (None: the tier); car: None = CAR not wired; adaptive:
    swaps experts into `resident` during decode; graphs: decode from CUDA graphs where the tier
    has them; device_routing: a card routes (top-k, CAR) where it can, else the host routes.
    """

    def __init__(
        self,
        model: Model,
        tier: Tier | None = None,
        n_ctx: int | None = None,
        resident: np.ndarray | None = None,
        car: CarKnobs | None = None,
        miss_runner: MissRunner | None = None,
        trace_path: str | None = None,
        adaptive: AdaptiveCache | None = None,
        graphs: bool = True,
        device_routing: bool = True,
    ):
        self.model, self.args = model, model.args
        a = self.args
        if tier is None:
            from strata.cpu.hybrid_tier import make_host_tier

            tier = make_host_tier(model, n_ctx=n_ctx or min(a.n_ctx_train, 4096))
        self.tier = tier
        self.miss_runner = miss_runner or tier
        if resident is None:  # which experts the tier holds: [L, E]; default all
            resident = np.ones((a.n_layer, a.n_expert), bool)
        self.resident = resident  # shared with `adaptive`, which swaps in place
        self.car = car
        self.adaptive = adaptive
        self.trace = (
            TraceWriter(trace_path, a.n_layer, a.n_expert, a.n_expert_used) if trace_path else None
        )
        self.pos = 0
        self.stats = EngineStats(
            expert_hist=np.zeros((a.n_layer, a.n_expert), np.int64), slack=SlackMeter(a.n_layer)
        )
        card = is_card(tier)
        self.moe = Moe(
            a,
            tier,
            self.miss_runner,
            resident,
            car,
            adaptive,
            self.trace,
            self.stats,
            card=card,
            pool=miss_runner is not None,
        )
        # prompts (and decode without graphs): eager; a card's top-k on the card where it can
        picks_on_card = card and device_routing and self.trace is None and tier.routes_on_device()
        self.eager = EagerStep(
            a,
            tier,
            self.moe,
            self.stats,
            picks_on_card=picks_on_card,
            grouped=picks_on_card and tier.moe_on_card_ok(),
        )
        kind = graph_step_kind(
            tier,
            card,
            graphs,
            self.miss_runner,
            traced=self.trace is not None,
            adaptive=adaptive is not None,
            device_routing=device_routing,
        )
        if kind == "all":
            self.step = AllResidentGraphStep(a, tier, self.stats)
        elif kind == "routed":
            self.step = RoutedGraphStep(
                a, tier, self.miss_runner, car, adaptive, self.stats, step_server_of(miss_runner)
            )
        elif kind == "hybrid":
            self.step = HostRoutedGraphStep(a, tier, self.moe, self.miss_runner, self.stats)
        else:
            self.step = self.eager
        self.graph_step = None if kind is None else self.step  # None: decode eagerly
        self.spec = None  # the speculative decoder (strata/engine/speculative.py), if any
        # CPU only with every expert in the pool: a decode token in one compiled call
        self.host_step = None
        if kind is None and not card and self.trace is None and adaptive is None:
            from strata.engine.steps.host import HostStep

            self.host_step = HostStep.build(tier, miss_runner, resident, self.stats.expert_hist)

    @property
    def n_ctx(self) -> int:
        return self.tier.n_ctx

    def reusable(self, n: int) -> int:
        """How many of the first n positions a new sequence may keep. KV rows are kept per
        position; a recurrent (DeltaNet) state only as a whole, where it stands (it cannot go
        back), so a hybrid model keeps n == pos or nothing."""
        if self.args.linear_attn and n != self.pos:
            return 0
        return n

    def reset(self, keep: int = 0) -> None:
        """Forget the sequence past `keep` positions (the KV rows beyond are overwritten later)."""
        self.pos = min(self.pos, keep)

    def _check(self, tokens: Sequence[int]) -> np.ndarray:
        a = self.args
        ids = np.asarray(tokens, dtype=np.int64)  # [T]
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("forward needs a non-empty 1-D list of token ids")
        if ids.min() < 0 or ids.max() >= a.n_vocab:
            raise ValueError(f"token id out of range 0..{a.n_vocab - 1}")
        if self.pos + ids.size > self.n_ctx:
            raise ValueError(f"context full: {self.pos + ids.size} tokens > n_ctx {self.n_ctx}")
        return ids

    def _graph_step(self, token: int, pick: str | None):
        """One decode step from CUDA graphs -> the logits [V] (a view until the next step), or
        the token picked on the card (no logits read back): `pick` "greedy" (the argmax) or
        "sample" (the chain, knobs set with the decoder's `set_sample`)."""
        out = self.graph_step(token, self.pos, pick)
        self.pos += 1
        self.stats.tokens += 1
        self.stats.decode_steps += 1
        self.stats.graph_steps += 1
        return out

    def _host_step(self, token: int, head: bool) -> int:
        """One decode step of `host_step` (every pick a miss) -> the greedy next token."""
        best = self.host_step(int(token), self.pos, head)
        st, n = self.stats, self.args.n_layer * self.args.n_expert_used
        st.misses += n
        st.decode_misses_before_car += n
        self.pos += 1
        st.tokens += 1
        st.decode_steps += 1
        return best

    def decode_greedy(self, token: int) -> int:
        """Decode `token` and return the greedy next token (lowest id on ties). On a GPU tier's
        graph steps the argmax runs on the card and no logits come back."""
        self._check([token])
        if self.graph_step is not None and self.pos > 0:
            return int(self._graph_step(int(token), "greedy"))
        if self.host_step is not None and self.pos > 0:
            return self._host_step(token, True)
        return int(np.argmax(self.forward([token])))

    def decode_sample(self, token: int, params: SampleKnobs, u: float) -> int:
        """Decode `token` and return the next token drawn by the sampling chain with uniform u in
        [0, 1) (strata/gpu/sample.py; the Sampler's math, so a seed gives the same tokens as
        sampling the logits). The GPU tier samples on the card, in graph steps too: only the id
        comes back."""
        ids = self._check([token])
        if self.graph_step is not None and self.pos > 0:
            self.tier.graph_decoder().set_sample(params, u)
            return int(self._graph_step(int(token), "sample"))
        if self.host_step is not None and self.pos > 0:
            self._host_step(token, False)
            return int(self.tier.output_sample(self.host_step.x[None], params, u))
        x = self._layers(ids, self.pos > 0)[-1:]  # [1, D]
        return int(self.tier.output_sample(x, params, u))

    def forward(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Run `tokens` at positions pos..; logits [V] of the last token ([T, V] if all_logits)."""
        ids = self._check(tokens)
        decode = ids.size == 1 and self.pos > 0
        if decode and self.graph_step is not None:
            out = np.array(self._graph_step(int(ids[0]), None), copy=True)
            return out[None] if all_logits else out
        if decode and self.host_step is not None:
            self._host_step(ids[0], True)
            out = self.host_step.logits.copy()
            return out[None] if all_logits else out
        x = self._layers(ids, decode)  # [T, D]
        if not all_logits:
            x = x[-1:]
        out = self.tier.output(x)  # [T or 1, V]
        return out if all_logits else out[0]

    def forward_hidden(
        self, tokens: Sequence[int], all_logits: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """`forward` eagerly, with the trunk's output-normed rows: (logits [V] of the last token
        ([T, V] if all_logits), h [T, D]), for the tiers that draft with a NextN block."""
        ids = self._check(tokens)
        x = self._layers(ids, ids.size == 1 and self.pos > 0)  # [T, D]
        logits, h = self.tier.output_hidden(x, last=not all_logits)
        return (logits if all_logits else logits[0]), h

    def _layers(self, ids: np.ndarray, decode: bool):
        """Every layer eagerly at positions pos.. (pos and counters advance) -> x [T, D]."""
        x = self.eager.layers(ids, self.pos, decode)
        self.pos += ids.size
        self.stats.tokens += ids.size
        self.stats.decode_steps += decode
        return x

    def close(self) -> None:
        if self.trace is not None:
            self.trace.close()
            self.trace = self.moe.trace = None
