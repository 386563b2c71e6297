"""A hybrid decode step routed on the card: top-k, CAR and the slots on the card; the host reads
each layer's plan record (strata.quant.plan_record), counts it and runs the CPU pool on the misses
while the card goes on. Queued whole where the decoder runs ahead (the card waits for the host
only at layers with misses), else per layer (two graphs, the resident experts queued behind the
plan). With the adaptive cache the step's router picks are observed after it and the swaps'
uploads start between steps."""

from __future__ import annotations

import time

import numpy as np

from strata.engine.moe import MissRunner
from strata.engine.stats import EngineStats
from strata.engine.tier import CardTier
from strata.gpu.route_car import layer_knobs
from strata.model.args import ModelArgs
from strata.quant.plan_record import DONE, ST_AFTER, ST_BEFORE, ST_RATIO, ST_SUBST, WAIT
from strata.routing.car import CarKnobs
from strata.routing.profile import AdaptiveCache, observe_step
from strata.routing.topk import count_picks


class RoutedGraphStep:
    """`make_server`: the miss runner's `step_server` (a `StepServer` that serves every layer of a
    queued step in one compiled call), or None where it has none (a Python round a layer)."""

    kind = "routed"

    def __init__(
        self,
        args: ModelArgs,
        tier: CardTier,
        miss_runner: MissRunner,
        car: CarKnobs | None,
        adaptive: AdaptiveCache | None,
        stats: EngineStats,
        make_server=None,
    ):
        self.args, self.tier, self.miss_runner = args, tier, miss_runner
        self.car, self.adaptive, self.stats = car, adaptive, stats
        self._make_server = make_server
        self._server = None  # (graph decoder, its StepServer or None): see _step_server

    def __call__(self, token: int, pos: int, pick: str | None):
        g = self.tier.graph_decoder()
        out = self._decode(g, token, pos, pick)
        if self.adaptive is not None:
            self._adapt_after(g)
        return out

    def _car_knobs(self) -> np.ndarray:
        """[L, route_car.N_KNOBS] for this decode step (warmup counted here, each layer's
        slack from the engine's running figures)."""
        car, st = self.car, self.stats
        return layer_knobs(car, st.decode_steps, st.slack, self.args.n_layer)

    def _decode(self, g, token: int, pos: int, pick: str | None):
        g.begin_routed(token, pos, self._car_knobs())
        if not g.ahead_ok(pick):  # per layer (a first step, or no queueing: see ahead_ok)
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
        """The adaptive cache after the step: every layer's router picks (the step's records)
        observed in one compiled call, the swaps' uploads started on the copy stream. The card
        routes to an admitted expert from the first step that begins after its upload is done
        (`GraphDecoder.begin_routed`); the evicted one leaves the table at once."""
        swaps = observe_step(self.adaptive, g.router_picks())
        self.stats.swaps += len(swaps)
        for i, cold, e in swaps:
            self.tier.prefetch(i, e, cold)

    def _serve_ahead(self, g) -> None:
        """Every layer of a queued step: in one compiled call where the miss runner can serve a
        step that way, else (or for a layer it hands back) a Python round a layer."""
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
        srv = None
        if self._make_server is not None:
            srv = self._make_server(
                g.pack_h.a, g.ready_h.a, g.release_h.a, g.y_h.a, self.stats.expert_hist
            )
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
        if end > first:  # the pool's jobs of each layer: its records' misses after CAR
            jobs = srv.recs_f[first:end, 4 * self.args.n_expert_used + ST_AFTER]
            st.add_windows(srv.windows(first, end), first, jobs)

    def _serve_plan(self, g, i: int, plan_of, zero_rows: bool) -> None:
        """Layer i: its plan (plan_of(i) waits for it), the counts, and the pool's rows of the
        misses into the decoder's y_h (with `zero_rows`, zeros where there are none: the
        per-layer step adds y_h whatever the plan)."""
        st, pc = self.stats, time.perf_counter
        t0 = pc()
        plan = plan_of(i)  # pinned views, refreshed in place every step
        t1 = pc()
        slots, stats = plan["pair_slot"], plan["stats"]
        count_picks(st.expert_hist[i], plan["ids0"][None])
        after = int(stats[ST_AFTER])
        st.decode_misses_before_car += int(stats[ST_BEFORE])
        st.substitutions += int(stats[ST_SUBST])
        st.ratio_sum += float(stats[ST_RATIO])
        st.hits += self.args.n_expert_used - after
        st.misses += after
        t2 = pc()
        if after:
            miss = np.where(slots < 0, plan["ids"], -1)[None]
            g.y_h.a[:] = self.miss_runner.experts(i, plan["h"], miss, plan["weights"][None])
        elif zero_rows:
            g.y_h.a[:] = 0.0
        t3 = pc()
        st.add_window(t0, t1, t2, t3, i, after)
