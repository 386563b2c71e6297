"""The forward pass: drives a device tier layer by layer with the routing module in between.

Per layer: attention and the router on the device tier; top-k; in decode windows the CAR plan
(substitute resident experts for some misses); resident picks on the device tier, missed picks on
the miss runner (the CPU pool; without one, the tier emulates it), summed.

T = tokens in the step, D = hidden, E = experts, K = experts per token, V = vocab, L = layers.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from strata.engine.car_fast import car_plan_fast
from strata.engine.route_fast import count_picks, observe_fast, observe_step, topk_fast
from strata.gpu.device import env_switch
from strata.gpu.sample import SampleKnobs, sample_ref
from strata.gpu.tier import DeviceTier
from strata.model.loader import Model
from strata.routing.car import CarKnobs
from strata.routing.profile import AdaptiveCache
from strata.routing.trace import TraceWriter

# a prompt chunk of at least this many tokens runs its missed experts on the tier's staging
# slots where it has them (llama.cpp offloads host-resident weights from a batch of 32)
PREFILL_OFFLOAD_MIN_T = 32


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
    # decode windows (per layer, summed over steps; seconds): wall time of the whole layer,
    # blocked on the card, host routing (top-k, CAR, statistics), the CPU pool's call
    window_layers: int = 0
    window_s: float = 0.0
    wait_s: float = 0.0
    route_s: float = 0.0
    pool_s: float = 0.0
    graph_steps: int = 0  # decode steps replayed from CUDA graphs
    offloaded: int = 0  # prompt picks missed by the cache and run from the tier's staging slots

    def add_window(self, t0: float, t1: float, t2: float, t3: float) -> None:
        """One layer's decode window: started t0, the card's result at t1, routed by t2, the
        pool done at t3 (perf_counter seconds)."""
        self.wait_s += t1 - t0
        self.route_s += t2 - t1
        self.pool_s += t3 - t2
        self.window_s += t3 - t0
        self.window_layers += 1

    def add_windows(self, w: np.ndarray) -> None:
        """Layers' decode windows at once: w [n, 3] seconds waiting, routing, in the pool."""
        self.wait_s += float(w[:, 0].sum())
        self.route_s += float(w[:, 1].sum())
        self.pool_s += float(w[:, 2].sum())
        self.window_s += float(w.sum())
        self.window_layers += w.shape[0]

    def window_ms(self) -> dict[str, float]:
        """Mean per-layer decode window split: total, waiting on the card, routing, pool."""
        n = max(1, self.window_layers)
        return {k: 1e3 * getattr(self, f"{k}_s") / n for k in ("window", "wait", "route", "pool")}

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
        graphs: bool = True,
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
        self.graphs = graphs  # decode from CUDA graphs where the tier has them
        # graph hybrid steps route on the card unless traces need the host
        self.device_routing = True
        # the adaptive cache on a card-routed step: the step's router picks observed after it,
        # the swaps uploaded between steps (STRATA_ADAPT_ROUTED=0: the host-routed hybrid step,
        # which observes layer by layer, the A/B arm)
        self.adapt_after_step = env_switch("STRATA_ADAPT_ROUTED") and hasattr(tier, "settled_slots")
        # a prompt's resident experts launched before its staged misses (see _moe)
        self.resident_first = env_switch("STRATA_PREFILL_RESIDENT_FIRST")
        self._swaps: list[tuple[int, int]] = []  # the adaptive cache's swaps of this layer
        self._server = None  # (graph decoder, its StepServer or None): see _step_server
        self._layer_rows = np.arange(a.n_layer)[:, None]  # [L, 1]
        self.pos = 0
        self.stats = EngineStats(expert_hist=np.zeros((a.n_layer, a.n_expert), np.int64))

    @property
    def n_ctx(self) -> int:
        return self.tier.n_ctx

    def reset(self, keep: int = 0) -> None:
        """Forget the sequence past `keep` positions (the KV rows beyond are overwritten later)."""
        self.pos = min(self.pos, keep)

    def _route(self, i: int, logits, decode: bool, picks=None):
        """Top-k, trace, CAR (decode), statistics, adaptive cache -> ids [T, K], weights
        [T, K], hit [T, K] (picks a resident expert serves). From logits [T, E], or from
        `picks` (ids, weights): the tier's top-k on the card (a prompt without a trace)."""
        a, st = self.args, self.stats
        if picks is not None:
            (ids, weights), probs = picks, None
        else:
            ids, weights, probs = topk_fast(logits, a.n_expert_used, a.norm_topk)  # [T, K], [T, E]
        count_picks(st.expert_hist[i], ids)
        if self.trace is not None:
            self.trace.write(self.pos, i, ids, probs, decode)
        resident = self.resident[i]  # [E]
        router_ids = ids
        car = self.car
        if decode and car is not None and self.stats.decode_steps >= car.warmup:
            plan = car_plan_fast(ids, probs, resident, car)  # car_plan's rule, compiled
            st.decode_misses_before_car += plan.misses
            st.substitutions += int(plan.substituted.sum())
            st.ratio_sum += float(plan.ratios.sum())
            ids = plan.ids
        elif decode:
            st.decode_misses_before_car += int((~resident[ids]).sum())
        hit = resident[ids]  # [T, K], before this step's swaps: an admitted expert serves
        n_hit = int(hit.sum())  # from the next step on (its upload runs meanwhile)
        st.hits += n_hit
        st.misses += hit.size - n_hit
        self._swaps = []
        if decode and self.adaptive is not None:
            self._swaps = observe_fast(self.adaptive, i, router_ids)
            st.swaps += len(self._swaps)
        return ids, weights, hit

    def _prefetch(self, i: int) -> None:
        """Start the uploads of the experts layer i just admitted (after the step's launches,
        which may still read the slots of the experts they evict)."""
        if self._swaps and hasattr(self.tier, "prefetch"):
            for cold, e in self._swaps:
                self.tier.prefetch(i, e, cold)

    def _moe(self, i: int, h: np.ndarray, logits, decode: bool, picks=None) -> np.ndarray:
        tier = self.tier
        ids, weights, hit = self._route(i, logits, decode, picks)
        n_hit = int(hit.sum())
        if n_hit == hit.size:
            y = self.tier.experts(i, h, ids, weights)
            self._prefetch(i)
            return y
        if not decode and h.shape[0] >= PREFILL_OFFLOAD_MIN_T and getattr(tier, "stage_n", 0):
            # a prompt: the misses run on the tier from its staging slots (uploading an
            # expert's bytes once beats the pool's compute-bound pass over many tokens). The
            # resident picks are launched first, so that the card computes them while the host
            # gathers the missed experts' bytes into pinned memory (STRATA_PREFILL_RESIDENT_FIRST
            # =0: the staged ones first, the A/B arm); the sum is staged + resident either way
            res = np.where(hit, ids, -1)
            yd = tier.experts(i, h, res, weights) if n_hit and self.resident_first else None
            y = tier.experts_staged(i, h, np.where(hit, -1, ids), weights)
            self.stats.offloaded += hit.size - n_hit
            if n_hit:
                y = y + (yd if yd is not None else tier.experts(i, h, res, weights))
            self._prefetch(i)
            return y
        # misses: x rows go host-ward once (before the resident launches, which a GPU tier then
        # runs while the pool computes), the pool's sum comes back to the tier's device
        hh = self._to_host(h)
        yd = self.tier.experts(i, h, np.where(hit, ids, -1), weights) if n_hit else None
        self._prefetch(i)
        y = self.miss_runner.experts(i, hh, np.where(hit, -1, ids), weights)
        if self._to_device is not None:
            y = self._to_device(y)
        if yd is not None:
            y = y + yd
        return y

    # ---- decode steps from CUDA graphs (a GPU tier that has them) ----
    def _graph_mode(self) -> str | None:
        """ "all" (one graph per token), "hybrid" (two per layer, the pool between) or None
        (eager launches) for a decode step on this engine's tier."""
        tier = self.tier
        if not self.graphs or not hasattr(tier, "graph_decoder"):
            return None
        if tier.all_resident and self.trace is None and self.adaptive is None:
            return "all"  # the host needs nothing per layer: routing stays on the card
        if self.miss_runner is not tier or tier.all_resident:
            if (
                self.device_routing
                and self.trace is None
                and (self.adaptive is None or self.adapt_after_step)
                and tier.routes_on_device()
            ):
                return "routed"  # top-k and CAR on the card; the host reads the plan
            return "hybrid"  # the host routes (traces, the adaptive cache) between graphs
        return None  # misses the tier serves by uploading experts on demand: eager

    def _decode_all_resident(self, g, token: int, pick: str | None = None):
        a, st = self.args, self.stats
        logits = g.step_all_resident(token, self.pos, pick)
        np.add.at(st.expert_hist, (self._layer_rows, g.picks_h.a), 1)
        st.hits += a.n_layer * a.n_expert_used
        return logits

    def _car_knobs(self) -> np.ndarray:
        """[threshold, budget, free ratio, on] for this decode step (warmup counted here)."""
        car = self.car
        on = car is not None and car.enabled and self.stats.decode_steps >= car.warmup
        if car is None:
            return np.array([1.0, 0.0, 1.0, 0.0])
        return np.array([car.threshold, car.budget, car.free_ratio, float(on)])

    def _decode_routed(self, g, token: int, pick: str | None = None):
        """Hybrid step routed on the card (top-k, CAR, the slots): queued whole where the decoder
        runs ahead (the card waits for the host only at layers with misses), else per layer
        (two graphs, the resident experts queued behind the plan). The host reads each plan,
        counts it and runs the pool on the misses while the card goes on."""
        g.begin_routed(token, self.pos, self._car_knobs())
        if not g.ahead_ok(pick):  # per layer (the A/B arm, or a first step: see ahead_ok)
            for i in range(self.args.n_layer):
                self._serve_plan(g, i, g.routed, zero_rows=True)
            return g.finish(pick)
        g.launch_ahead(pick)
        try:
            self._serve_ahead(g)
        except BaseException:
            g.release_all()  # the card must not wait for rows that will not come
            raise
        return g.finish_ahead(pick)

    def _adapt_after(self, g) -> None:
        """The adaptive cache after a card-routed step: every layer's router picks (the step's
        records) observed in one compiled call, the swaps' uploads started on the copy stream.
        The card routes to an admitted expert from the first step that begins after its upload
        is done (`GraphDecoder.begin_routed`); the evicted one leaves the table at once."""
        swaps = observe_step(self.adaptive, g.router_picks())
        self.stats.swaps += len(swaps)
        for i, cold, e in swaps:
            self.tier.prefetch(i, e, cold)

    def _serve_ahead(self, g) -> None:
        """Every layer of a queued step: in one compiled call where the miss runner can serve a
        step that way (`step_server`: strata/cpu/serve.py, the pool's resident team), else (or
        for a layer it hands back) a Python round a layer (`_serve_plan`)."""
        from strata.cpu.serve import DONE, WAIT

        n_layer = self.args.n_layer
        srv = self._step_server(g)
        i = 0
        while i < n_layer:
            if srv is not None and srv.usable():
                status, j = srv.run(g.step, i)
                self._count_served(srv, i, j)
                i = j
                if status == DONE:
                    break
                if status == WAIT:  # a long wait: on in Python (which checks the card runs)
                    g.wait_plan(i)
                    continue
            # a layer the server handed back (an expert to copy to RAM, a team that timed out),
            # or no server
            self._serve_plan(g, i, g.wait_plan, zero_rows=False)
            g.release(i)
            i += 1

    def _step_server(self, g):
        """The miss runner's `StepServer` for decoder g's pinned arrays (made once), or None."""
        if self._server is not None and self._server[0] is g:
            return self._server[1]
        make = getattr(self.miss_runner, "step_server", None)
        srv = None
        if make is not None:
            srv = make(g.pack_h.a, g.ready_h.a, g.release_h.a, g.y_h.a, self.stats.expert_hist)
        self._server = (g, srv)
        return srv

    def _count_served(self, srv, first: int, end: int) -> None:
        """Add what `srv` served of layers first..end-1 to the engine's stats."""
        st, c = self.stats, srv.take_counts()
        st.decode_misses_before_car += int(c["misses_before_car"])
        st.substitutions += int(c["substitutions"])
        st.ratio_sum += c["ratio_sum"]
        st.misses += int(c["misses"])
        st.hits += int(c["layers"]) * self.args.n_expert_used - int(c["misses"])
        self.miss_runner.count_served(c)
        if end > first:
            st.add_windows(srv.windows(first, end))

    def _serve_plan(self, g, i: int, plan_of, zero_rows: bool) -> None:
        """Layer i of a routed step: its plan (plan_of(i) waits for it), the counts, and the
        pool's rows of the misses into the decoder's y_h (with `zero_rows`, zeros where there are
        none: the per-layer step adds y_h whatever the plan)."""
        st, pc = self.stats, time.perf_counter
        t0 = pc()
        plan = plan_of(i)  # pinned views, refreshed in place every step
        t1 = pc()
        slots, stats = plan["pair_slot"], plan["stats"]
        count_picks(st.expert_hist[i], plan["ids0"][None])
        after = int(stats[2])
        st.decode_misses_before_car += int(stats[0])
        st.substitutions += int(stats[1])
        st.ratio_sum += float(stats[3])
        st.hits += self.args.n_expert_used - after
        st.misses += after
        t2 = pc()
        if after:
            miss = np.where(slots < 0, plan["ids"], -1)[None]
            g.y_h.a[:] = self.miss_runner.experts(i, plan["h"], miss, plan["weights"][None])
        elif zero_rows:
            g.y_h.a[:] = 0.0
        t3 = pc()
        st.add_window(t0, t1, t2, t3)

    def _decode_hybrid(self, g, token: int, pick: str | None = None):
        """Per layer: the card's front half, host routing, resident experts launched, the pool
        on the misses meanwhile; its sum joins on the card at the next layer's front."""
        a, st, tier = self.args, self.stats, self.tier
        pc = time.perf_counter
        g.begin(token, self.pos)
        for i in range(a.n_layer):
            t0 = pc()
            h, logits = g.front(i)  # [1, D], [1, E] pinned host views
            t1 = pc()
            ids, weights, hit = self._route(i, logits, True)
            uploads = tier.expert_uploads
            slots = tier.slots_for(i, np.where(hit, ids, -1))  # adaptive admits upload here
            if tier.expert_uploads != uploads:
                tier.sync_uploads()
            g.pair_h.a[:] = slots[0]
            g.pairw_h.a[:] = weights[0]
            g.experts(i)
            self._prefetch(i)
            t2 = pc()
            if hit.all():
                g.y_h.a[:] = 0.0
            else:
                g.y_h.a[:] = self.miss_runner.experts(i, h, np.where(hit, -1, ids), weights)
            t3 = pc()
            st.add_window(t0, t1, t2, t3)
        return g.finish(pick)

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

    def _graph_step(self, mode: str, token: int, pick: str | None):
        """One decode step from CUDA graphs -> the logits [V] (a view until the next step), or
        the token picked on the card (no logits read back): `pick` "greedy" (the argmax) or
        "sample" (the chain, knobs set with the decoder's `set_sample`)."""
        g = self.tier.graph_decoder()
        if mode == "all":
            out = self._decode_all_resident(g, token, pick)
        elif mode == "routed":
            out = self._decode_routed(g, token, pick)
            if self.adaptive is not None:
                self._adapt_after(g)
        else:
            out = self._decode_hybrid(g, token, pick)
        self.pos += 1
        self.stats.tokens += 1
        self.stats.decode_steps += 1
        self.stats.graph_steps += 1
        return out

    def decode_greedy(self, token: int) -> int:
        """Decode `token` and return the greedy next token (lowest id on ties). On a GPU tier's
        graph steps the argmax runs on the card and no logits come back."""
        self._check([token])
        mode = self._graph_mode() if self.pos > 0 else None
        if mode is not None:
            return int(self._graph_step(mode, int(token), "greedy"))
        return int(np.argmax(self.forward([token])))

    def decode_sample(self, token: int, params: SampleKnobs, u: float) -> int:
        """Decode `token` and return the next token drawn by the sampling chain with uniform u in
        [0, 1) (strata/gpu/sample.py; the Sampler's math, so a seed gives the same tokens as
        sampling the logits). The GPU tier samples on the card, in graph steps too: only the id
        comes back."""
        ids = self._check([token])
        mode = self._graph_mode() if self.pos > 0 else None
        if mode is not None:
            self.tier.graph_decoder().set_sample(params, u)
            return int(self._graph_step(mode, int(token), "sample"))
        x = self._layers(ids, self.pos > 0)[-1:]  # [1, D]
        sample = getattr(self.tier, "output_sample", None)
        if sample is None:
            return sample_ref(self.tier.output(x)[0], params, u)
        return int(sample(x, params, u))

    def forward(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Run `tokens` at positions pos..; logits [V] of the last token ([T, V] if all_logits)."""
        tier = self.tier
        ids = self._check(tokens)
        decode = ids.size == 1 and self.pos > 0
        mode = self._graph_mode() if decode else None
        if mode is not None:
            out = np.array(self._graph_step(mode, int(ids[0]), None), copy=True)
            return out[None] if all_logits else out
        x = self._layers(ids, decode)  # [T, D]
        if not all_logits:
            x = x[-1:]
        out = tier.output(x)  # [T or 1, V]
        return out if all_logits else out[0]

    def _layers(self, ids: np.ndarray, decode: bool):
        """Embed ids [T] and run every layer at positions pos.. (pos and counters advance) ->
        the last residual x [T, D] (the tier's array kind)."""
        a, tier = self.args, self.tier
        x = tier.embed(ids)  # [T, D]
        # a prompt's top-k on the card where the tier can (no host top-k between its router
        # and its experts); traces keep the host's, which records the probabilities
        on_card = (
            not decode
            and self.device_routing
            and self.trace is None
            and hasattr(tier, "router_picks")
            and tier.routes_on_device()
        )
        # every expert resident: the picks are grouped on the card as well, nothing is read
        # back between the layers (the host queues the whole prompt); the counts come at the end
        grouped = on_card and hasattr(tier, "moe_on_card") and tier.moe_on_card_ok()
        for i in range(a.n_layer):
            x = tier.attention(i, x, self.pos)
            if grouped:
                h, y = tier.moe_on_card(i, x)  # [T, D], [T, D]
            elif on_card:
                h, pk, pw = tier.router_picks(i, x)  # [T, D], ids [T, K], weights [T, K]
                y = self._moe(i, h, None, decode, picks=(pk, pw))
            else:
                h, logits = tier.router(i, x)  # [T, D], [T, E]
                y = self._moe(i, h, logits, decode)
            if a.shared_ff:
                y = y + tier.shared_expert(i, h)
            x = x + y
        if grouped:
            counts = tier.take_pick_counts()  # [L, E]
            self.stats.expert_hist += counts
            self.stats.hits += int(counts.sum())
        self.pos += ids.size
        self.stats.tokens += ids.size
        self.stats.decode_steps += decode
        return x

    def close(self) -> None:
        if self.trace is not None:
            self.trace.close()
            self.trace = None
