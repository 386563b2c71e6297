"""The CPU-only tier of hybrid linear-attention models (qwen3next, qwen35moe): `HostTier` with
gated DeltaNet layers (deltanet.py, a conv window and a recurrent state per layer) and gated full
attention (output times sigmoid of the q projection's gate half, q/k RMS norm, NEOX RoPE over the
first n_rot dims; qwen35moe's multi-section RoPE is that for text). The FFN side is HostTier's:
the router reads post_attention_norm, the shared expert is sigmoid-gated, the routed experts run
in the CPU pool or here.

The recurrent state holds one sequence and only moves forward: a forward at position 0 starts a
new sequence, one at the position the state has reached continues it, and any other position
(rewinding into a prefix) is refused (`RecurrentRewind`): the state of an earlier position is
gone. A speculative verify step alone takes tokens back: `verify_begin` saves the states,
`verify_keep` keeps the first n of the forward's tokens. Shape letters: strata/model/args.py and
deltanet.py.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import MODEL_TENSOR as MT

from strata.cpu import deltanet as dn
from strata.cpu.dense import linears
from strata.cpu.half import round_f16, to_f32
from strata.cpu.kv import dequantize_kv_rows, quantize_kv_rows
from strata.cpu.tier import EXPERT_MATS, HOST_ATTN_SCORES_BYTES, HostTier, rope_inv_freq
from strata.quant import fmt
from strata.quant.dequant import dequant

SSM_A = "blk.{i}.ssm_a"  # the one tensor name without a .weight suffix


class RecurrentRewind(ValueError):
    """A forward at a position the recurrent state is not at (it cannot go back)."""


def make_host_tier(model, n_ctx: int, **kw) -> HostTier:
    """The CPU-only tier the model needs: this one for hybrid linear-attention models."""
    cls = HybridHostTier if model.args.linear_attn else HostTier
    return cls(model, n_ctx, **kw)


class HybridHostTier(HostTier):
    name = "host"

    def _load_layer(self, i: int) -> dict:
        model, a = self.model, self.args

        L = {
            "attn_norm": dequant(model.tensor(MT.ATTN_NORM, i)),
            "ffn_norm": dequant(model.tensor(MT.ATTN_POST_NORM, i)),  # before the MoE
            "router": self._linear(MT.FFN_GATE_INP, i),
            "sh_gate": self._linear(MT.FFN_GATE_SHEXP, i),
            "sh_up": self._linear(MT.FFN_UP_SHEXP, i),
            "sh_down": self._linear(MT.FFN_DOWN_SHEXP, i),
            "sh_inp": dequant(model.tensor(MT.FFN_GATE_INP_SHEXP, i)),
        }
        if not a.is_recurrent(i):
            L.update(
                q=self._linear(MT.ATTN_Q, i),  # [2*H*Dh, D]: per head q then gate
                k=self._linear(MT.ATTN_K, i),
                v=self._linear(MT.ATTN_V, i),
                o=self._linear(MT.ATTN_OUT, i),
                q_norm=dequant(model.tensor(MT.ATTN_Q_NORM, i)),
                k_norm=dequant(model.tensor(MT.ATTN_K_NORM, i)),
            )
            return L
        if model.has(f"blk.{i}.attn_qkv.weight"):
            L["qkv"] = self._linear(MT.ATTN_QKV, i)  # [C, D]
            L["z"] = self._linear(MT.ATTN_GATE, i)  # [Hv*Dv, D]
        else:
            L["qkvz"] = self._linear(MT.SSM_IN, i)  # legacy: per key head [q, k, v, z]
        if model.has(f"blk.{i}.ssm_ba.weight"):
            L["ba"] = self._linear(MT.SSM_BETA_ALPHA, i)  # [2*Hv, D], per key head [b, a]
        else:  # qwen35moe: two projections [Hv, D]
            L["beta"] = self._linear(MT.SSM_BETA, i)
            L["alpha"] = self._linear(MT.SSM_ALPHA, i)
        L.update(
            conv_w=dequant(model.tensor(MT.SSM_CONV1D, i)),  # [C, Kc]
            dt_bias=dequant(model.tensor(f"blk.{i}.ssm_dt.bias")),  # [Hv]
            ssm_a=dequant(model.tensor(SSM_A.format(i=i))),  # [Hv], -exp(A_log)
            ssm_norm=dequant(model.tensor(MT.SSM_NORM, i)),  # [Dv]
            out=self._linear(MT.SSM_OUT, i),  # [D, Hv*Dv]
        )
        return L

    def _init_rest(self, model) -> None:
        super()._init_rest(model)
        a = self.args
        self.inv_freq = rope_inv_freq(a.rope_dims, a.rope_theta)  # [n_rot/2]
        c = 2 * a.ssm_n_group * a.ssm_d_state + a.ssm_d_inner
        self.conv_state = {}  # layer -> [Kc-1, C]
        self.rec_state = {}  # layer -> [Hv, Dv, Dk]
        for i in range(a.n_layer):
            if a.is_recurrent(i):
                self.conv_state[i] = np.zeros((a.ssm_d_conv - 1, c), np.float32)
                self.rec_state[i] = np.zeros((a.ssm_dt_rank,) + (a.ssm_d_state,) * 2, np.float32)
        self._saved: dict | None = None  # verify_begin's copies of the states
        self._saved_pos: dict = {}
        self._inputs: dict | None = None  # layer -> its recurrence inputs, while verifying
        c_layers = set(self.conv_state)
        self.state_pos = dict.fromkeys(self.conv_state, 0)  # the position each state is at
        # KV rows for the attention layers only: layer -> its row in the caches
        self.kv_row = {i: n for n, i in enumerate(i for i in range(a.n_layer) if i not in c_layers)}
        if a.n_nextn:  # the NextN block's attention has a row of its own (loaded on first use)
            self.kv_row[a.n_layer] = len(self.kv_row)
        n_attn = len(self.kv_row)
        self.k_cache, self.v_cache = self.k_cache[:n_attn].copy(), self.v_cache[:n_attn].copy()
        if self.k_scale is not None:
            self.k_scale, self.v_scale = self.k_scale[:n_attn].copy(), self.v_scale[:n_attn].copy()

    # ---- the NextN (MTP) block: a draft of the token after next ----
    def _load_nextn(self) -> dict:
        """Layer L's tensors (a gated attention block with MoE) and the NextN ones, on first use."""
        model, i = self.model, self.args.n_layer
        if len(self.layers) > i:
            return self.layers[i]
        L = self._load_layer(i)

        def opt(tname: str, fallback):
            return tname if model.has(tname) else fallback

        L.update(
            eh_proj=self._linear(MT.NEXTN_EH_PROJ, i),  # [D, 2D]
            enorm=dequant(model.tensor(MT.NEXTN_ENORM, i)),
            hnorm=dequant(model.tensor(MT.NEXTN_HNORM, i)),
            embd=model.tensor(opt(f"blk.{i}.nextn.embed_tokens.weight", MT.TOKEN_EMBD)),
            head_norm=dequant(
                model.tensor(opt(f"blk.{i}.nextn.shared_head_norm.weight", MT.OUTPUT_NORM))
            ),
        )
        own_head = f"blk.{i}.nextn.shared_head_head.weight"
        L["head"] = self._linear(own_head) if model.has(own_head) else self.lm_head
        self.expert_vec_dot.append(
            tuple(fmt(model.tensor(m, i).qtype).vec_dot for m in EXPERT_MATS)
        )
        self.layers.append(L)
        return L

    def nextn(self, h: np.ndarray, tokens: np.ndarray, pos0: int) -> np.ndarray:
        """Draft logits [T, V] of the NextN block: h [T, D] the trunk's output-normed rows at
        positions pos0.., tokens [T] the tokens after them (the reference's forward_nextn).
        Its routed experts run on this tier; its KV row holds the positions drafted so far."""
        return self.nextn_head(self.nextn_hidden(h, tokens, pos0))

    def nextn_head(self, x: np.ndarray) -> np.ndarray:
        """The NextN block's LM head on its head-normed rows x [T, D] -> logits [T, V]."""
        return self._load_nextn()["head"](x)

    def nextn_hidden(self, h: np.ndarray, tokens: np.ndarray, pos0: int) -> np.ndarray:
        """`nextn` up to its head: the head-normed rows [T, D] (what a chained draft step reads
        as its h, the head's input)."""
        a, i = self.args, self.args.n_layer
        if not a.n_nextn:
            raise ValueError(f"{a.arch}: this file has no NextN (MTP) block")
        L = self._load_nextn()
        e = dequant(L["embd"], np.asarray(tokens, dtype=np.int64))  # [T, D]
        eh = np.concatenate([self.rms_norm(e, L["enorm"]), self.rms_norm(h, L["hnorm"])], axis=-1)
        x = self.gated_attention(i, L["eh_proj"](eh), pos0)  # [T, D]
        hn, logits = self.router(i, x)  # post_attention_norm; [T, E]
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        ids = np.argsort(-p, axis=-1, kind="stable")[:, : a.n_expert_used]  # [T, K]
        w = np.take_along_axis(p, ids, axis=-1)
        w = w / np.maximum(w.sum(axis=-1, keepdims=True), np.float32(6.103515625e-5))
        x = x + self.experts(i, hn, ids, w.astype(np.float32)) + self.shared_expert(i, hn)
        return self.rms_norm(x, L["head_norm"])  # [T, D]

    def output_hidden(self, x: np.ndarray, last: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """`output` and the output-normed rows it read: (logits [T, V] (of the last row only:
        [1, V] if `last`), h [T, D], what the NextN block reads)."""
        h = self.rms_norm(x, self.out_norm)
        return self.lm_head(h[-1:] if last else h), h

    def experts(
        self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """HostTier's experts; while verifying drafts row by row (tokens that share an expert
        meet in one matrix product otherwise, whose sums differ from a one-token step's)."""
        one = super().experts
        if self._inputs is None or h.shape[0] == 1:
            return one(layer, h, ids, weights)
        rows = range(h.shape[0])
        return np.concatenate([one(layer, h[[t]], ids[[t]], weights[[t]]) for t in rows])

    def rope(self, x: np.ndarray, pos0: int) -> np.ndarray:
        """NEOX RoPE over the first n_rot dims of x [T, heads, Dh] at positions pos0.."""
        r = self.args.rope_dims
        if r == x.shape[-1]:
            return super().rope(x, pos0)
        return np.concatenate([super().rope(x[..., :r], pos0), x[..., r:]], axis=-1)

    def attention(self, layer: int, x: np.ndarray, pos0: int) -> np.ndarray:
        if self.args.is_recurrent(layer):
            return self.deltanet(layer, x, pos0)
        return self.gated_attention(layer, x, pos0)

    # ---- DeltaNet ----
    def snapshot(self) -> dict:
        """A copy of every DeltaNet state and the position it stands at (a speculative step's
        rollback point, a server's saved prefix); KV rows need none, they are kept per position."""
        return {
            i: (self.conv_state[i].copy(), self.rec_state[i].copy(), self.state_pos[i])
            for i in self.conv_state
        }

    def verify_begin(self) -> None:
        """Save every DeltaNet state (into buffers made once) and keep the next forward's
        recurrence inputs, so that `verify_keep` can take back its rejected tokens."""
        if self._saved is None:
            self._saved = {
                i: (c.copy(), self.rec_state[i].copy()) for i, c in self.conv_state.items()
            }
        for i, (conv, rec) in self._saved.items():
            np.copyto(conv, self.conv_state[i])
            np.copyto(rec, self.rec_state[i])
        self._saved_pos = dict(self.state_pos)
        self._inputs = {}

    def verify_keep(self, n: int) -> None:
        """After one forward of T tokens since `verify_begin`: the DeltaNet states as if only its
        first n tokens had run. The conv window is the last Kc-1 rows of [saved window; inputs
        :n]; the recurrence is replayed from the saved state over those n rows (the kernel runs
        token by token, so the bits equal a forward of the n tokens alone)."""
        inputs, self._inputs = self._inputs, None
        for i, (qkv, q, k, v, g, beta) in inputs.items():
            if n == qkv.shape[0]:
                continue
            conv, rec = self._saved[i]
            w = conv.shape[0]  # Kc-1
            keep = np.concatenate([conv, qkv[:n]])[n : n + w]  # [Kc-1, C]
            np.copyto(self.conv_state[i], keep)
            np.copyto(self.rec_state[i], rec)
            dn.delta_rule(q[:n], k[:n], v[:n], g[:n], beta[:n], self.rec_state[i])
            self.state_pos[i] = self._saved_pos[i] + n

    def restore(self, snap: dict) -> int:
        """Put a `snapshot` back -> the position the sequence continues from."""
        for i, (conv, rec, pos) in snap.items():
            self.conv_state[i][...] = conv
            self.rec_state[i][...] = rec
            self.state_pos[i] = pos
        return min((p for _, _, p in snap.values()), default=0)

    def _state_at(self, layer: int, pos0: int) -> None:
        """Start the layer's state afresh at position 0; refuse any position it is not at."""
        if pos0 == 0:
            self.conv_state[layer][...] = 0
            self.rec_state[layer][...] = 0
        elif pos0 != self.state_pos[layer]:
            raise RecurrentRewind(
                f"layer {layer}'s recurrent state is at position {self.state_pos[layer]}, "
                f"not {pos0}: a DeltaNet model cannot reuse part of a sequence"
            )

    def deltanet(self, layer: int, x: np.ndarray, pos0: int) -> np.ndarray:
        a, L = self.args, self.layers[layer]
        self._state_at(layer, pos0)
        t, hk, hv, dk = x.shape[0], a.ssm_n_group, a.ssm_dt_rank, a.ssm_d_state
        h = self.rms_norm(x, L["attn_norm"])  # [T, D]
        lins = [L["qkv"], L["z"]] if "qkv" in L else [L["qkvz"]]
        lins += [L["ba"]] if "ba" in L else [L["beta"], L["alpha"]]
        ys = linears(lins, h) if self.dense == "quant" else [lin(h) for lin in lins]
        if "qkv" in L:
            qkv, z = ys[0], ys[1]
        else:
            qkv, z = _split_legacy(ys[0], hk, dk)
        if "ba" in L:
            ba = ys[-1].reshape(t, hk, 2, hv // hk)
            b, alpha = ba[:, :, 0].reshape(t, hv), ba[:, :, 1].reshape(t, hv)  # [T, Hv]
        else:
            b, alpha = ys[-2], ys[-1]
        beta = np.float32(1.0) / (np.float32(1.0) + np.exp(-b))
        g = dn.softplus(alpha + L["dt_bias"]) * L["ssm_a"]  # [T, Hv]
        qkv = np.ascontiguousarray(qkv, np.float32)
        y = dn.conv(qkv, self.conv_state[layer], L["conv_w"])
        y = y / (np.float32(1.0) + np.exp(-y))  # SiLU [T, C]
        q = dn.l2_norm(y[:, : hk * dk].reshape(t, hk, dk), self.eps)  # [T, Hk, Dk]
        k = dn.l2_norm(y[:, hk * dk : 2 * hk * dk].reshape(t, hk, dk), self.eps)
        v = np.ascontiguousarray(y[:, 2 * hk * dk :].reshape(t, hv, dk))  # [T, Hv, Dv]
        rep = hv // hk  # value head j reads key head j // rep, or (tiled) j % Hk
        if a.v_heads_tiled:
            q, k = np.tile(q, (1, rep, 1)), np.tile(k, (1, rep, 1))  # [T, Hv, Dk]
        else:
            q, k = np.repeat(q, rep, axis=1), np.repeat(k, rep, axis=1)
        q, k = np.ascontiguousarray(q), np.ascontiguousarray(k)
        g, beta = np.ascontiguousarray(g), np.ascontiguousarray(beta)
        if self._inputs is not None:
            self._inputs[layer] = (qkv, q, k, v, g, beta)
        o = dn.delta_rule(q, k, v, g, beta, self.rec_state[layer])
        self.state_pos[layer] = pos0 + t
        o = dn.gated_rms_norm(o, L["ssm_norm"], z.reshape(t, hv, dk), self.eps)
        return x + L["out"](o.reshape(t, -1))

    # ---- gated attention ----
    def gated_attention(self, layer: int, x: np.ndarray, pos0: int) -> np.ndarray:
        a, L = self.args, self.layers[layer]
        t = x.shape[0]
        if pos0 + t > self.n_ctx:
            raise ValueError(f"context is full: {pos0 + t} tokens > n_ctx {self.n_ctx}")
        h = self.rms_norm(x, L["attn_norm"])  # [T, D]
        if self.dense == "quant":
            qg, k, v = linears([L["q"], L["k"], L["v"]], h)
        else:
            qg, k, v = L["q"](h), L["k"](h), L["v"](h)
        qg = qg.reshape(t, a.n_head, 2 * a.head_dim)
        q, gate = qg[..., : a.head_dim], qg[..., a.head_dim :]  # [T, H, Dh] each
        k = k.reshape(t, a.n_head_kv, a.head_dim)  # [T, G, Dh]
        v = v.reshape(t, a.n_head_kv, a.v_head_dim)
        q = self.rms_norm(q, L["q_norm"])
        k = self.rms_norm(k, L["k_norm"])
        q, k = self.rope(q, pos0), self.rope(k, pos0)
        o = self._attend(layer, q, k, v, pos0)  # [T, H*Dv]
        o = o * (np.float32(1.0) / (np.float32(1.0) + np.exp(-gate))).reshape(t, -1)
        return x + L["o"](o)

    def _attend(self, layer: int, q, k, v, pos0: int) -> np.ndarray:
        """Append k, v [T, G, Dh] to the cache and attend q [T, H, Dh] -> o [T, H*Dv] (HostTier's
        arithmetic: f16 or int8 cache, f16 q and probabilities)."""
        a = self.args
        t = q.shape[0]
        s = pos0 + t
        layer = self.kv_row[layer]  # its row in the attention layers' caches
        if self.kv_type == "int8":
            self.k_cache[layer, pos0:s], self.k_scale[layer, pos0:s] = quantize_kv_rows(k)
            self.v_cache[layer, pos0:s], self.v_scale[layer, pos0:s] = quantize_kv_rows(v)
            kc = dequantize_kv_rows(self.k_cache[layer, :s], self.k_scale[layer, :s])
            vc = dequantize_kv_rows(self.v_cache[layer, :s], self.v_scale[layer, :s])
        else:
            self.k_cache[layer, pos0:s] = k
            self.v_cache[layer, pos0:s] = v
            kc, vc = to_f32(self.k_cache[layer, :s]), to_f32(self.v_cache[layer, :s])
        g, rep = a.n_head_kv, a.n_head // a.n_head_kv
        qg = round_f16(q).reshape(t, g, rep, a.head_dim).transpose(1, 2, 0, 3)  # [G, R, T, Dh]
        scale = np.float32(1 / np.sqrt(a.head_dim))
        kt, vt = kc.transpose(1, 2, 0)[:, None], vc.transpose(1, 0, 2)[:, None]
        o = np.empty((t, a.n_head * a.v_head_dim), np.float32)
        step = max(1, HOST_ATTN_SCORES_BYTES // (4 * a.n_head * s))
        if self._inputs is not None:  # verifying drafts: each row as its own decode step
            step = 1  # computes it (the same sums, bit for bit, not a masked longer row's)
        for c0 in range(0, t, step):
            c1 = min(t, c0 + step)
            end = pos0 + c1
            scores = np.matmul(qg[:, :, c0:c1], kt[..., :end]) * scale  # [G, R, n, S']
            if c1 - c0 > 1:
                mask = np.arange(end)[None, :] > (pos0 + np.arange(c0, c1))[:, None]
                np.copyto(scores, np.float32(-np.inf), where=mask)
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores, out=scores)
            p /= p.sum(axis=-1, keepdims=True)
            oc = np.matmul(round_f16(p), vt[:, :, :end])  # [G, R, n, Dv]
            o[c0:c1] = oc.transpose(2, 0, 1, 3).reshape(c1 - c0, -1)
        return o


def _split_legacy(mixed: np.ndarray, hk: int, dk: int) -> tuple[np.ndarray, np.ndarray]:
    """ssm_in's output [T, C + Hv*Dv], per key head [q, k, v, z] -> (qkv [T, C], z)."""
    t = mixed.shape[0]
    x = mixed.reshape(t, hk, -1)
    rv = (x.shape[-1] - 2 * dk) // 2
    qkv = np.concatenate(
        [x[..., :dk].reshape(t, -1), x[..., dk : 2 * dk].reshape(t, -1),
         x[..., 2 * dk : 2 * dk + rv].reshape(t, -1)], axis=-1)  # fmt: skip
    return qkv, np.ascontiguousarray(x[..., 2 * dk + rv :].reshape(t, -1))
