"""Decode steps of a `CupyTier` replayed from CUDA graphs: every launch of a token captured once.

Two shapes of step (T = 1):

- **all resident** (every expert in a VRAM slot): one graph per token: the token id and position
  come in from pinned memory, embedding, L x (attention, router, top-k on the device, the (slot,
  weight) pairs from the layer's slot table, resident experts, residual), output; the logits (or
  only the token the card picked: the argmax, or a draw with knobs written to pinned memory
  before the replay) and the L x K picks go out to pinned memory. The host only waits for it.
- **hybrid** (some experts in the CPU pool): per layer i, graph A_i (the previous layer's MoE sum
  completed: the pool's rows come in and are added; attention; router; h and the router logits go
  host-ward) and graph B_i (the host's (slot, weight) pairs come in; the resident experts run).
  Between them the host routes (top-k, cache-aware routing, statistics); while B_i runs on the
  card the host runs the pool on the missed picks: the two tiers overlap.
- **hybrid routed on the card, queued ahead** (CUDA; not on ROCm, where the card reading pinned
  host memory while the host writes it has not run on an AMD card): one graph per token, as the
  all-resident one, with top-k + CAR on the card writing each layer's plan (and h) into pinned
  memory, then a ready word (the step's number). The host polls the ready words, counts the
  plans and runs the pool on the missed picks; the next layer starts with `pool_join`, which
  waits for the host's release counter only if the plan left picks to the pool. Layers whose
  experts are all resident never wait for the host.
- **the adaptive cache on a routed step**: after the step the engine observes its router picks
  (the records' ids0) and uploads the admitted experts on the tier's copy stream; `begin_routed`
  sends the card a slot table without the experts whose uploads are still in flight (their picks
  go to the pool meanwhile), so no step waits for a copy. An evicted expert leaves the table at
  once; its slot is overwritten only after the steps already queued.
- **hybrid routed on the card, per layer** (ROCm and the emulator): graph A_i
  up to the plan and graph B_i, the resident experts of the device-side plan, queued right behind
  it; the host waits on an event between them, reads the plan, runs the pool, and launches A_i+1
  with the pool's rows.

The MoE sum adds in the eager path's order (pool + resident + shared, then x + y), and the
kernels are the eager path's, so a graph step gives the eager step's bits. Kernel arguments are
fixed at capture: the position is read from device memory, buffers are preallocated here or in
the tier's workspace, so nothing is allocated per token. A segment runs eagerly the first time
(which also compiles its kernels) and is captured right after; later tokens replay the graph.

D = hidden, E = experts, K = experts per token, L = layers, V = vocab.
"""

from __future__ import annotations

import numpy as np

from strata.gpu.attention import dec_grid_for
from strata.gpu.elementwise import argmax_rows
from strata.gpu.embed import embed
from strata.gpu.host_wait import SPINS, wait_word
from strata.gpu.pool_join import pool_join, ticket
from strata.gpu.route_car import N_KNOBS as N_CAR_KNOBS
from strata.gpu.route_car import pack_words, route_car
from strata.gpu.router_topk import router_topk
from strata.gpu.sample import N_KNOBS, knob_values, sample_row


def _plan_views(w: np.ndarray, k: int, d: int) -> dict:
    """Views of one packed plan record (route_car.pack_words): ids0, ids, weights, pair_slot
    [K], stats [4], h [1, D]."""
    return {
        "ids0": w[:k].view(np.int32),
        "ids": w[k : 2 * k].view(np.int32),
        "weights": w[2 * k : 3 * k].view(np.float32),
        "pair_slot": w[3 * k : 4 * k].view(np.int32),
        "stats": w[4 * k : 4 * k + 4].view(np.float32),
        "h": w[4 * k + 4 :].view(np.float32).reshape(1, d),
    }


class Pinned:
    """A page-locked host array (async copies to and from the card, capturable in graphs)."""

    def __init__(self, cp, shape: tuple[int, ...], dtype):
        n = int(np.prod(shape))
        self.mem = cp.cuda.alloc_pinned_memory(max(1, n * np.dtype(dtype).itemsize))
        self.a = np.frombuffer(self.mem, dtype, n).reshape(shape)
        self.a[...] = 0


def routed_ahead(cp) -> bool:
    """Whether routed steps are queued ahead: on CUDA only. The emulator runs a kernel at its
    launch (nothing to wait on); HIP builds it, but the card reading pinned host memory while the
    host writes it has not run on an AMD card."""
    emulated = getattr(cp, "__emulated__", False)
    return not emulated and not getattr(cp.cuda.runtime, "is_hip", False)


class GraphDecoder:
    """T = 1 decode steps of `tier` from CUDA graphs (see the module docstring)."""

    def __init__(self, tier):
        self.t = tier
        cp = self.cp = tier.cp
        a = tier.args
        d, e, k, n_layer = a.n_embd, a.n_expert, a.n_expert_used, a.n_layer
        self.k = k
        self.stream = cp.cuda.Stream(non_blocking=True)
        rt = cp.cuda.runtime
        self._h2d, self._d2h = rt.memcpyHostToDevice, rt.memcpyDeviceToHost
        f32 = np.float32
        # host side (pinned)
        self.tokpos_h = Pinned(cp, (3,), np.int32)  # token id, position, step (mod 2^31)
        self.y_h = Pinned(cp, (1, d), f32)  # the CPU pool's sum of the current layer
        self.h_h = Pinned(cp, (1, d), f32)  # h = ffn_norm(x), for the pool
        self.logits_r = Pinned(cp, (1, e), f32)  # router logits
        self.pair_h = Pinned(cp, (k,), np.int32)  # the host's resident (slot) picks, -1 = pool
        self.pairw_h = Pinned(cp, (k,), f32)
        self.pairexp_h = Pinned(cp, (k,), np.int32)  # their experts (gpt-oss: the biases)
        self.logits_h = Pinned(cp, (1, a.n_vocab), f32)
        self.picks_h = Pinned(cp, (n_layer, k), np.int32)  # all-resident step: router picks
        self.tok_h = Pinned(cp, (1,), np.int32)  # the token picked on the card
        self.sample_h = Pinned(cp, (N_KNOBS,), np.float64)  # sampling knobs + u (sample.py)
        # device side (reserved by the tier's workspace: `device_bytes`)
        self.tokpos_d = cp.zeros((3,), np.int32)
        self.tok_d = cp.zeros((1,), np.int32)
        self.xa = cp.zeros((1, d), f32)  # the residual stream between layers
        self.xb = cp.zeros((1, d), f32)  # after attention
        self.y_d = cp.zeros((1, d), f32)  # the MoE sum
        self.moe_out = cp.zeros((1, d), f32)  # resident experts
        self.sh_out = cp.zeros((1, d), f32)  # shared expert
        self.topk_ids = cp.zeros((n_layer, k), np.int32)
        self.topk_w = cp.zeros((n_layer, k), f32)
        self.slot_table = cp.asarray(tier.slot_of)  # [L, E] -> slot (the card's routing)
        self.table_h = Pinned(cp, (n_layer, e), np.int32)  # the table last sent to the card
        self.table_h.a[...] = tier.slot_of
        self._unsettled = False  # uploads in flight left out of the table (begin_routed)
        # the device-routed hybrid step: router top-k + CAR on the card (kernels/route_car.cu)
        self.knobs_h = Pinned(cp, (n_layer, N_CAR_KNOBS), np.float64)  # route_car.layer_knobs
        self.knobs_d = cp.zeros((n_layer, N_CAR_KNOBS), np.float64)
        self.plan = {
            "probs": cp.zeros((1, e), f32),
            "ids0": cp.zeros((1, k), np.int32),
            "ids": cp.zeros((1, k), np.int32),
            "weights": tier.pair_w[:k].reshape(1, k),  # the experts kernel reads these two
            "pair_slot": tier.pair_slot[:k].reshape(1, k),
            "stats": cp.zeros((1, 4), f32),
        }
        # the plan and h come back packed in one record (one copy per layer): views made once
        self.pack_d = cp.zeros((pack_words(k, d),), np.uint32)
        self.pack_h = Pinned(cp, (n_layer, pack_words(k, d)), np.uint32)  # a record a layer
        self.plans_h = [_plan_views(w, k, d) for w in self.pack_h.a]
        self._slot_version = tier.slot_version
        self.plan_ready = cp.cuda.Event(disable_timing=True)  # per layer: recorded after A_i
        # queued ahead: the step number lands in ready_h[i] after layer i's plan; the host counts
        # release_h up to pool_join's ticket once the pool's rows of layer i are in y_h
        self.ready_h = Pinned(cp, (n_layer,), np.int32)
        self.release_h = Pinned(cp, (1,), np.uint32)
        self.step = 0
        self.ahead = routed_ahead(cp)
        if self.ahead:
            wait_word(self.ready_h.a, 0, -1, 1)  # compiled now, not inside the first step
        self.graphs: dict[object, object] = {}
        self._ran_eagerly: set = set()  # keys of deferred captures (`_run`)
        self._warm: set = set()  # picks of finished per-layer routed steps (`ahead_ok`)
        self.replay = True  # False: the same launches, eagerly every step (tests, debugging)
        self.shared = a.shared_ff > 0
        self._out_act = tier.act(d, tier.lm_head.vec_dot)

    @staticmethod
    def device_bytes(a) -> int:
        """Device bytes of the decoder's own buffers for model args `a`."""
        k = a.n_expert_used
        return (
            4 * (3 + 5 * a.n_embd + 2 * a.n_layer * k + a.n_layer * a.n_expert)
            + 4 * (a.n_expert + 3 * k + 4)
            + 4 * pack_words(k, a.n_embd)
            + 8 * N_CAR_KNOBS * a.n_layer
        )

    # ---- copies on the decoder's stream (pinned host memory: capturable) ----
    def _up(self, dst, src: np.ndarray) -> None:
        self.cp.cuda.runtime.memcpyAsync(
            dst.data.ptr, src.ctypes.data, src.nbytes, self._h2d, self.stream.ptr
        )

    def _down(self, dst: np.ndarray, src) -> None:
        self.cp.cuda.runtime.memcpyAsync(
            dst.ctypes.data, src.data.ptr, dst.nbytes, self._d2h, self.stream.ptr
        )

    # ---- segments: eager launches on self.stream, each captured once ----
    def _seg_embed(self) -> None:
        t = self.t
        self._up(self.tokpos_d, self.tokpos_h.a)
        embed(t.K, t.embd, self.tokpos_d[0:1], 1, self.xa)

    def _seg_front(self, i: int, host: bool) -> None:
        """x (xa) -> attention -> xb -> h and router logits (-> host if `host`)."""
        t = self.t
        t._attention(i, self.xa, 0, self.xb, 1, pos_dev=self.tokpos_d[1:2])
        t._router_into(i, self.xb, t.h_buf[:1], 1)
        if host:
            self._down(self.h_h.a, t.h_buf[:1])
            self._down(self.logits_r.a, t.rlogits_buf[:1])

    def _seg_front_routed(self, i: int, ready: bool = False) -> None:
        """Attention, router, top-k + CAR on the card; the plan and h go host-ward (into row i),
        with `ready` the step's number after them (ready_h[i])."""
        t, a = self.t, self.t.args
        self._seg_front(i, host=False)
        # queued ahead, the kernel writes the record into pinned memory itself, then the ready
        # word: no copies in the graph; per layer, one copy of the record
        pack = self.pack_h.a[i] if ready else self.pack_d
        route_car(
            t.K, t.rlogits_buf, 1, a.n_expert, self.k, a.norm_topk, self.slot_table[i],
            self.knobs_d[i], self.plan, pack, t.h_buf[:1],
            self.ready_h.a[i : i + 1] if ready else None, self.tokpos_d[2:3] if ready else None,
        )  # fmt: skip
        if not ready:
            self._down(self.pack_h.a[i], self.pack_d)

    def _seg_join(self, i: int) -> None:
        """xa = xb + ((pool + resident) + shared) of layer i, the pool's rows read from y_h
        once the host releases layer i, and only if its plan left picks to the pool."""
        t = self.t
        pool_join(
            t.K, self.plan["stats"][0], self.release_h.a, self.tokpos_d[2:3], t.args.n_layer, i,
            self.y_h.a, self.moe_out, self.sh_out if self.shared else None, self.xb, self.xa,
            t.args.n_embd,
        )  # fmt: skip

    def _seg_experts_routed(self, i: int) -> None:
        """The resident experts of the card's own plan (pair_slot/pair_w are in place)."""
        t = self.t
        t._moe_pairs(i, 1, self.k, self.moe_out)
        if self.shared:
            t._shared_into(i, t.h_buf[:1], 1, self.sh_out)

    def _seg_experts(self, i: int, device_routing: bool) -> None:
        t, cp = self.t, self.cp
        if device_routing:  # the router's picks go out as the pair list in the same launch
            a = t.args
            router_topk(
                t.K, t.rlogits_buf, 1, a.n_expert, self.k, a.norm_topk,
                self.topk_ids[i], self.topk_w[i], self.slot_table[i], t.pair_slot, t.pair_w,
                gating=a.gating,
            )  # fmt: skip
        else:
            self._up(t.pair_slot[: self.k], self.pair_h.a)
            self._up(t.pair_w[: self.k], self.pairw_h.a)
            if t.layers[i].exp_bias is not None:
                self._up(t.pair_exp[: self.k], self.pairexp_h.a)
        pe = self.topk_ids[i] if device_routing else None  # the pairs' experts (their biases)
        if device_routing and not self.shared:
            # nothing from the pool or a shared expert: x = xb + resident, added by the down kernel
            t._moe_pairs(i, 1, self.k, self.xa, resid=self.xb, pair_exp=pe)
            return
        t._moe_pairs(i, 1, self.k, self.moe_out, pair_exp=pe)
        if self.shared:
            t._shared_into(i, t.h_buf[:1], 1, self.sh_out)
        if device_routing:  # nothing from the pool: y = resident + shared, x = xb + y
            y = self.moe_out
            cp.add(y, self.sh_out, out=y)
            cp.add(self.xb, y, out=self.xa)

    def _seg_finish_moe(self) -> None:
        """xa = xb + ((pool + resident) + shared): the eager path's order of sums."""
        cp = self.cp
        self._up(self.y_d, self.y_h.a)
        cp.add(self.y_d, self.moe_out, out=self.y_d)
        if self.shared:
            cp.add(self.y_d, self.sh_out, out=self.y_d)
        cp.add(self.xb, self.y_d, out=self.xa)

    def _seg_output(self, picks: bool, pick: str | None = None) -> None:
        t = self.t
        t._output_into(self.xa, 1, self._out_act)
        if pick == "greedy":  # the argmax on the card: 4 bytes come back instead of the logits
            argmax_rows(t.K, t.logits_buf, 1, t.args.n_vocab, self.tok_d)
            self._down(self.tok_h.a, self.tok_d)
        elif pick == "sample":  # the sampling chain on the card, knobs from set_sample
            sb = t.sample_bufs
            self._up(sb.knobs, self.sample_h.a)
            sample_row(t.K, t.logits_buf, t.args.n_vocab, sb)
            self._down(self.tok_h.a, sb.tok)
        else:
            self._down(self.logits_h.a, t.logits_buf[:1])
        if picks:
            self._down(self.picks_h.a, self.topk_ids)

    def _run(self, key, fn, defer_capture: bool = False) -> None:
        """Replay the graph of `key`, or run fn eagerly and capture it for the next token: right
        after the eager launches (which may still run), or with `defer_capture` at the next
        call, on an idle card (a queued-ahead step's joins wait for the host meanwhile)."""
        key = (key, self.t.attn_ws.dec_nsplit)  # each decode attention grid its own graphs (_begin)
        g = self.graphs.get(key)
        if g is None and defer_capture and key in self._ran_eagerly:
            g = self._capture(key, fn)
        if g is not None:
            g.launch(self.stream)
            return
        with self.stream:
            fn()
        if not self.replay:
            return
        if defer_capture:
            self._ran_eagerly.add(key)
        else:
            self._capture(key, fn)

    def _capture(self, key, fn):
        with self.stream:
            self.stream.begin_capture()
            try:
                with self.t.K.pdl_scope():  # kernel starts overlap (pdl.py); eager runs don't
                    fn()
            finally:
                g = self.graphs[key] = self.stream.end_capture()
        return g

    def _begin(self, token: int, pos: int) -> None:
        self.step += 1
        if self.step > 0x7FFFFFFF:  # int32 on the card: start the step, ready and release
            self.stream.synchronize()  # counts over (a step let go after an error may still run)
            self.step = 1
            self.ready_h.a[:] = 0
            self.release_h.a[0] = 0
        self.tokpos_h.a[:] = token, pos, self.step
        # the decode attention for this position (attention.dec_grid_for): the one-launch short
        # kernel, or the smallest grid that splits its keys as the full one does (same bits,
        # fewer idle blocks); the step's launches read it from the workspace
        ws = self.t.attn_ws
        ws.dec_nsplit = dec_grid_for(ws, pos)
        # order after whatever the tier ran on the legacy stream (prefill, uploads)
        self.stream.wait_event(self.cp.cuda.Stream.null.record())

    # ---- the steps ----
    def set_sample(self, params, u: float) -> None:
        """The knobs and uniform u of the next step picked with "sample" (sample.knob_values)."""
        self.sample_h.a[:] = knob_values(params, u)

    def step_all_resident(self, token: int, pos: int, pick: str | None = None):
        """One decode step with every expert resident -> logits [V] (a view, valid until the
        next step), or with `pick` ("greedy", "sample") the token picked on the card;
        self.picks_h.a [L, K] holds the router's picks."""
        n_layer = self.t.args.n_layer

        def whole() -> None:
            self._seg_embed()
            for i in range(n_layer):
                self._seg_front(i, host=False)
                self._seg_experts(i, device_routing=True)
            self._seg_output(picks=True, pick=pick)

        self._begin(token, pos)
        self._run(("all", pick), whole)
        self.stream.synchronize()
        return int(self.tok_h.a[0]) if pick else self.logits_h.a[0]

    def front(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Hybrid step, layer i: finish layer i-1's MoE (the pool's rows in y_h), attention,
        router; waits for the card -> (h [1, D], router logits [1, E]) as pinned host views."""
        if i == 0:
            self._run(("a", 0), lambda: (self._seg_embed(), self._seg_front(0, host=True)))
        else:
            self._run(("a", i), lambda: (self._seg_finish_moe(), self._seg_front(i, host=True)))
        self.stream.synchronize()
        return self.h_h.a, self.logits_r.a

    def experts(self, i: int) -> None:
        """Launch layer i's resident experts on pair_h / pairw_h (returns at once)."""
        self.t.await_uploads(self.stream)
        self._run(("b", i), lambda: self._seg_experts(i, device_routing=False))

    def finish(self, pick: str | None = None):
        """The last layer's MoE sum and the output -> logits [V] (view, valid until next step),
        or with `pick` ("greedy", "sample") the token picked on the card."""
        self._run(
            ("out", pick),
            lambda: (self._seg_finish_moe(), self._seg_output(picks=False, pick=pick)),
        )
        self.stream.synchronize()
        self._warm.add(pick)
        return int(self.tok_h.a[0]) if pick else self.logits_h.a[0]

    def begin(self, token: int, pos: int) -> None:
        """Start a hybrid step: the token and its position go to the card with graph A_0."""
        self._begin(token, pos)

    # ---- the hybrid step routed on the card ----
    def begin_routed(self, token: int, pos: int, knobs: np.ndarray) -> None:
        """Start a device-routed hybrid step with CAR knobs [L, N_KNOBS] (route_car.layer_knobs)."""
        t = self.t
        if t.slot_version != self._slot_version or self._unsettled:  # swapped or re-placed
            # experts still uploading stay out of the card's table (their picks go to the pool)
            # until their bytes are in: a step never waits for the copy stream
            tab, self._unsettled = t.settled_slots()
            if not np.array_equal(tab, self.table_h.a):
                self.table_h.a[...] = tab
                self._up(self.slot_table, self.table_h.a)  # the stream's last step is done
            self._slot_version = t.slot_version
        if not np.array_equal(self.knobs_h.a, knobs):  # a layer's slack moved: on the stream
            self.knobs_h.a[:] = knobs
            self._up(self.knobs_d, self.knobs_h.a)
        self._begin(token, pos)

    def routed(self, i: int) -> dict:
        """Per-layer arm: layer i up to the card's routing plan, its resident experts queued
        right behind it; waits for the plan only -> its pinned host views (ids0, ids, weights,
        pair_slot [K], stats [4], h [1, D]). The pool's rows of layer i-1 must be in y_h."""
        if i == 0:
            self._run(("ra", 0), lambda: (self._seg_embed(), self._seg_front_routed(0)))
        else:
            self._run(("ra", i), lambda: (self._seg_finish_moe(), self._seg_front_routed(i)))
        self.stream.record(self.plan_ready)
        self._run(("rb", i), lambda: self._seg_experts_routed(i))
        self.plan_ready.synchronize()
        return self.plans_h[i]

    def ahead_ok(self, pick: str | None = None) -> bool:
        """Whether a routed step with `pick` can be queued whole: the decoder runs ahead, and a
        per-layer step has launched every kernel the queued one launches but pool_join. A kernel
        launched the first time may be loaded then, and loading may wait for the card to go idle:
        with a join waiting for the host, that would never happen."""
        return self.ahead and pick in self._warm

    def launch_ahead(self, pick: str | None = None) -> None:
        """Queue the whole routed step (begin_routed first); then per layer `wait_plan(i)`, the
        pool's rows into y_h where the plan left picks to it, `release(i)`; `finish_ahead`."""
        n_layer = self.t.args.n_layer

        def whole() -> None:
            self._seg_embed()
            for i in range(n_layer):
                if i:
                    self._seg_join(i - 1)
                self._seg_front_routed(i, ready=True)
                self._seg_experts_routed(i)
            self._seg_join(n_layer - 1)
            self._seg_output(picks=False, pick=pick)

        self._run(("ahead", pick), whole, defer_capture=True)

    def wait_plan(self, i: int) -> dict:
        """Wait for layer i's plan of the queued step -> its pinned host views (see `routed`)."""
        ready, step = self.ready_h.a, self.step
        while not wait_word(ready, i, step, SPINS):  # the GIL free meanwhile
            if self.stream.done and ready[i] != step:
                raise RuntimeError(f"the card stopped before layer {i}'s routing plan")
        return self.plans_h[i]

    def release(self, i: int) -> None:
        """Let the card past layer i's join (y_h holds the pool's rows if the plan had misses)."""
        self.release_h.a[0] = ticket(self.step, self.t.args.n_layer, i)

    def release_all(self) -> None:
        """Let the queued step run to its end (after a host error: its result is not used)."""
        self.release(self.t.args.n_layer - 1)

    def router_picks(self) -> np.ndarray:
        """[L, K] the router's picks (before CAR) of the last routed step, from its records."""
        return self.pack_h.a[:, : self.k].view(np.int32)

    def finish_ahead(self, pick: str | None = None):
        """Wait for the queued step -> logits [V] (a view) or the token picked on the card."""
        self.stream.synchronize()
        return int(self.tok_h.a[0]) if pick else self.logits_h.a[0]
