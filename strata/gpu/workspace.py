"""The preallocated workspace of a `CupyTier`: activation buffers per (size, vec_dot), the
attention workspace, the prompt and decode buffers, all reserved in the budget once."""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.gpu.attention import AttnWorkspace
from strata.gpu.budget import MIB
from strata.gpu.decode_graph import GraphDecoder
from strata.gpu.experts import TileBufs
from strata.gpu.norm_quant import ActBuf
from strata.gpu.sample import SampleBufs
from strata.quant import fmt

QT = GGMLQuantizationType
# tokens per chunk of the grouped (prefill) expert kernels: 512 against 128 on the H200 with the
# tensor-core tiles took prefill 305.3 -> 292.7 ms (a larger chunk fills an expert's tiles more)
MOE_TMAX = 512
ATTN_SCORES_BYTES = 64 * MIB  # bound on the attention scores workspace (sets its query chunk)


class Workspace:
    """Sizes and allocates CupyTier's buffers (nothing is allocated per token)."""

    # ---- workspace ----
    def _act_specs(self) -> dict[tuple, tuple[int, int, QT]]:
        """(n, vec_dot[, tag]) -> (n, rows, vec_dot) for every activation a matmul needs."""
        a, tm, pt = self.args, self.tmax, self.ptmax
        specs: dict = {}

        def add(n: int, vd, rows: int = tm, tag: str = "") -> None:
            key = (n, int(vd), tag) if tag else (n, int(vd))
            old = specs.get(key)
            specs[key] = (n, max(rows, old[1] if old else 0), QT(int(vd)))

        for L in self.layers:  # attention and router: prompt chunks of ptmax rows
            add(a.n_embd, L.qkv[0][0].vec_dot, pt)
            for w, _ in L.qkv[1:]:
                add(a.n_embd, w.vec_dot, pt)
            add(a.n_head * a.v_head_dim, L.o.vec_dot, pt)
            add(a.n_embd, L.router.vec_dot, pt)
            add(a.n_embd, fmt(L.exp_qt[0]).vec_dot, pt)
            add(a.expert_ff, fmt(L.exp_qt[2]).vec_dot, self.moe_rows, "moe")
            add(a.n_embd, fmt(L.exp_qt[0]).vec_dot, self.moe_tmax, "moe_h")
            if L.sh:
                add(a.n_embd, L.sh["gate"].vec_dot)
                add(a.n_embd, L.sh["up"].vec_dot)
                add(a.shared_ff, L.sh["down"].vec_dot)
        add(a.n_embd, self.lm_head.vec_dot)
        return specs

    def _alloc_workspace(self) -> None:
        a, cp, tm = self.args, self.cp, self.tmax
        h, g, dh, dv = self.dims
        # experts of a long prompt: chunks of moe_tmax tokens, pairs grouped by expert
        self.moe_tmax = max(tm, MOE_TMAX)
        self.moe_rows = self.moe_tmax * a.n_expert_used  # (token, expert) pairs of a chunk
        # a prompt's attention projections, RoPE and router: chunks of ptmax rows (tm's chunks
        # of 32 gave the projection GEMVs a fraction of the card and 16x the launches)
        self.ptmax = pt = self.moe_tmax
        self.att_tmax = max(1, min(tm, ATTN_SCORES_BYTES // (4 * h * self.n_ctx)))
        specs = self._act_specs()
        nbytes = sum(ActBuf.bytes_for(n, r, vd) for n, r, vd in specs.values())
        nbytes += AttnWorkspace.bytes_for(self.K, h, g, self.n_ctx, dv, self.att_tmax)
        fs = max(a.shared_ff, 1)
        floats = tm * (a.n_embd + a.n_vocab + 3 * fs + 1)  # xn, logits, shared expert, gate
        floats += pt * (self.qkv_dim + h * dh + h * dv + a.n_embd + a.n_expert)
        floats += pt * 2 * a.n_expert_used  # router_picks' ids and weights
        floats += self.moe_rows * (a.expert_ff + 4)  # moe_act, pair_slot/_w/_exp, a row slack
        nbytes += 4 * floats + 4 * tm + 4 + TileBufs.bytes_for(self.moe_rows, a.n_embd)
        nbytes += 2 * 4 * a.n_layer * a.n_expert  # the card's slot table, its pick counts
        nbytes += GraphDecoder.device_bytes(a)  # built on the first graph decode step
        nbytes += SampleBufs.bytes_for(a.n_vocab)
        self.budget.reserve("workspace", nbytes)
        self._graph: GraphDecoder | None = None
        self.acts = {k: ActBuf(cp, n, r, vd) for k, (n, r, vd) in specs.items()}
        self.attn_ws = AttnWorkspace(cp, self.K, h, g, self.n_ctx, dv, self.att_tmax)
        self.qkv_buf = cp.empty((pt, self.qkv_dim), np.float32)
        self.q_buf = cp.empty((pt, h, dh), np.float32)
        self.o_buf = cp.empty((pt, h * dv), np.float32)
        self.h_buf = cp.empty((pt, a.n_embd), np.float32)
        self.xn_buf = cp.empty((tm, a.n_embd), np.float32)
        self.logits_buf = cp.empty((tm, a.n_vocab), np.float32)
        self.rlogits_buf = cp.empty((pt, a.n_expert), np.float32)
        self.picks_buf = cp.empty((2 * pt * a.n_expert_used,), np.int32)  # router_picks' ids, w
        self.sh_buf = cp.empty((3, tm, fs), np.float32)
        self.sh_gate_buf = cp.empty((tm, 1), np.float32)
        self.moe_act = cp.empty((self.moe_rows, a.expert_ff), np.float32)
        self.pair_slot = cp.empty((self.moe_rows,), np.int32)
        self.pair_w = cp.empty((self.moe_rows,), np.float32)
        self.pair_exp = cp.zeros((self.moe_rows,), np.int32)  # each pair's expert (its biases)
        self.tiles = TileBufs(cp, self.moe_rows, a.n_embd)
        # a prompt's experts grouped on the card (moe_on_card): slot_of's copy, pick counts
        self.slot_dev = cp.full((a.n_layer, a.n_expert), -1, np.int32)
        self._slot_dev_version = -1
        self.pick_hist = cp.zeros((a.n_layer, a.n_expert), np.int32)
        self.ids_buf = cp.empty((tm,), np.int32)
        self.pos_buf = cp.zeros((1,), np.int32)  # the decode position, read by the kernels
        self.sample_bufs = SampleBufs(cp, a.n_vocab)  # sampling on the card (eager and graphs)
        self._last_h = None  # (h view handed out by router, layer)

    def act(self, n: int, vec_dot) -> ActBuf:
        return self.acts[(n, int(vec_dot))]
