"""A prompt's path on a `CupyTier`: the router with top-k on the card (`router_picks`) and the
resident experts grouped by expert on the card with nothing read back (`moe_on_card`)."""

from __future__ import annotations

import numpy as np

from strata.gpu.experts import moe_experts_grouped, tile_pairs
from strata.gpu.norm_quant import norm_quant
from strata.gpu.pairs_card import GP_THREADS, group_pairs
from strata.gpu.router_topk import router_topk
from strata.quant import fmt


class PromptPath:
    """CupyTier's prompt-only steps (T > 1), in chunks of `ptmax` rows."""

    def router_picks(self, layer: int, x) -> tuple[object, np.ndarray, np.ndarray]:
        """`router` with the top-k on the card (router_topk.cu, route_topk's rule; expf's
        float noise apart): (h, ids [T, K] int32, weights [T, K] float32); one read-back a layer
        of the picks (T*K*8 bytes) instead of the logits, and no host top-k between the card's
        router and the layer's experts. The engine takes it for a prompt without a trace."""
        h, flat = self._router_chunks(layer, x, picks=True)
        t, k = int(h.shape[0]), self.args.n_expert_used
        both = self.cp.asnumpy(flat[: 2 * t * k])  # one read-back a layer
        return h, both[: t * k].reshape(t, k), both[t * k :].view(np.float32).reshape(t, k)

    def moe_on_card_ok(self) -> bool:
        """Whether `moe_on_card` serves a prompt: every expert resident, few enough experts
        for group_pairs.cu."""
        return self.args.n_expert <= GP_THREADS and self.all_resident

    def moe_on_card(self, layer: int, x) -> tuple[object, object]:
        """A prompt's ffn norm, router, top-k and resident experts with nothing read back:
        x [T, D] -> (h [T, D], the experts' weighted sum [T, D]) (the caller's array kind). Per
        chunk of ptmax rows the picks stay on the card, are grouped there by expert
        (pairs_card.group_pairs) and counted into `pick_hist` (`take_pick_counts`); the same
        kernels and tiles as router_picks + experts, so the same bits. Every pick must have a
        slot (`moe_on_card_ok`)."""
        xd, host = self._in(x)
        t = xd.shape[0]
        a, L, K, k = self.args, self.layers[layer], self.K, self.args.n_expert_used
        cp, pt = self.cp, self.ptmax
        if self._slot_dev_version != self.slot_version:
            self.slot_dev.set(self.slot_of)
            self._slot_dev_version = self.slot_version
        h = self.h_buf[:t] if t <= pt else cp.empty((t, a.n_embd), np.float32)
        y = cp.empty((t, a.n_embd), np.float32)
        ids = self.picks_buf[: pt * k]
        w = self.picks_buf[pt * k : 2 * pt * k].view(np.float32)
        gh = self.acts[(a.n_embd, int(fmt(L.exp_qt[0]).vec_dot), "moe_h")]
        aact = self.acts[(a.expert_ff, int(fmt(L.exp_qt[2]).vec_dot), "moe")]
        nt = tile_pairs(self.exp_mma)
        self.await_uploads()
        for c0, n in self._chunks(t, pt):
            self._router_into(layer, xd[c0 : c0 + n], h[c0 : c0 + n], n)
            router_topk(
                K, self.rlogits_buf, n, a.n_expert, k, a.norm_topk, ids[: n * k].reshape(n, k),
                w[: n * k].reshape(n, k), gating=a.gating,
            )  # fmt: skip
            bound = group_pairs(
                K, ids, n * k, self.slot_dev[layer], a.n_expert, nt, self.pair_slot, self.tiles,
                self.pick_hist[layer],
            )  # fmt: skip
            norm_quant(K, h[c0 : c0 + n], n, act=gh)
            moe_experts_grouped(
                K, L.exp_qt, (a.n_embd, a.expert_ff), self.stores, gh, None, self.pair_slot, w,
                self.tiles, self.moe_act, aact, y[c0 : c0 + n], mma=self.exp_mma,
                card=(n, k, bound), bias=L.exp_bias, pair_exp=ids, oai=self.oai,
            )  # fmt: skip
        self._last_h = None
        return self._out(h, host), self._out(y, host)

    def take_pick_counts(self) -> np.ndarray:
        """The picks `moe_on_card` counted since the last call, [L, E] int64 (then zeroed)."""
        counts = self.cp.asnumpy(self.pick_hist).astype(np.int64)
        self.pick_hist.fill(0)
        return counts

    def _router_chunks(self, layer: int, x, picks: bool):
        """h (the caller's array kind) and, on the device, the logits [T, E] or (picks) the flat
        ids [T*K] then weights [T*K] of x's rows, in chunks of ptmax rows queued without a wait."""
        xd, host = self._in(x)
        t = xd.shape[0]
        a, k = self.args, self.args.n_expert_used
        small = t <= self.ptmax
        h = self.h_buf[:t] if small else self.cp.empty((t, a.n_embd), np.float32)
        if picks:
            out = self.picks_buf if small else self.cp.empty((2 * t * k,), np.int32)
            ids_d = out[: t * k].reshape(t, k)
            w_d = out[t * k : 2 * t * k].view(np.float32).reshape(t, k)
        else:
            out = self.rlogits_buf[:t] if small else self.cp.empty((t, a.n_expert), np.float32)
        for c0, n in self._chunks(t, self.ptmax):
            lg = self.rlogits_buf[:n] if picks else out[c0 : c0 + n]
            self._router_into(layer, xd[c0 : c0 + n], h[c0 : c0 + n], n, lg)
            if picks:
                router_topk(
                    self.K, lg, n, a.n_expert, k, a.norm_topk, ids_d[c0 : c0 + n],
                    w_d[c0 : c0 + n], gating=a.gating,
                )  # fmt: skip
        self._last_h = (h, layer) if small else None
        return self._out(h, host), out
