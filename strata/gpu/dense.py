"""The dense weights of a `CupyTier` on the card: norms, the fused q|k|v projection, output,
router, shared expert and lm_head, uploaded once as raw GGUF blocks (`DeviceWeight`)."""

from __future__ import annotations

import numpy as np
from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import GGMLQuantizationType

from strata.cpu.tier import EXPERT_MATS
from strata.gpu.device import DeviceError
from strata.gpu.gemv import DeviceWeight
from strata.model.arch.common import name
from strata.quant.dequant import dequant

QT = GGMLQuantizationType


class _Layer:
    __slots__ = (
        "attn_norm", "ffn_norm", "q_norm", "k_norm", "qkv", "o", "router", "sh", "exp_qt",
        "sinks", "exp_bias",
    )  # fmt: skip


class DenseWeights:
    """Loads the model's dense tensors (CupyTier's `layers`, `embd`, `out_norm`, `lm_head`)."""

    # ---- loading ----
    def _dense_bytes(self) -> int:
        m = self.model
        return m.dense_bytes()

    def _weight(self, t: MT | str, layer: int | None = None, bias: str | None = None):
        ref = self.model.tensor(t, layer)
        rows, cols = (int(np.prod(ref.shape[:-1])), int(ref.shape[-1]))
        b = dequant(self.model.tensor(bias)) if bias else None
        return DeviceWeight(self.cp, ref.raw(), ref.qtype, rows, cols, bias=b)

    def _vec(self, t: MT | str, layer: int | None = None):
        return self.cp.asarray(dequant(self.model.tensor(t, layer)).reshape(-1))

    def _load_dense(self) -> None:
        a, m, cp = self.args, self.model, self.cp
        self.embd = self._weight(MT.TOKEN_EMBD)
        self.layers: list[_Layer] = []
        for i in range(a.n_layer):
            L = _Layer()
            L.attn_norm, L.ffn_norm = self._vec(MT.ATTN_NORM, i), self._vec(MT.FFN_NORM, i)
            L.q_norm = self._vec(MT.ATTN_Q_NORM, i) if a.qk_norm else None
            L.k_norm = self._vec(MT.ATTN_K_NORM, i) if a.qk_norm else None
            L.qkv = self._load_qkv(i)
            # gpt-oss: biases on the output and the router, a sink logit per head [H]
            L.o = self._weight(MT.ATTN_OUT, i, name(MT.ATTN_OUT, i, "bias") if a.o_bias else None)
            rb = name(MT.FFN_GATE_INP, i, "bias") if a.router_bias else None
            L.router = self._weight(MT.FFN_GATE_INP, i, rb)
            L.sinks = self._vec(MT.ATTN_SINKS, i) if a.attn_sinks else None
            L.sh = None
            if a.shared_ff:
                inp = dequant(m.tensor(MT.FFN_GATE_INP_SHEXP, i)).reshape(1, -1)
                L.sh = {
                    "gate": self._weight(MT.FFN_GATE_SHEXP, i),
                    "up": self._weight(MT.FFN_UP_SHEXP, i),
                    "down": self._weight(MT.FFN_DOWN_SHEXP, i),
                    "inp": DeviceWeight(cp, inp, QT.F32, 1, inp.shape[1]),
                }
            L.exp_qt = tuple(m.tensor(t, i).qtype for t in EXPERT_MATS)
            L.exp_bias = None  # gpt-oss: [E, 2F + D] each expert's gate, up and down biases
            if a.expert_bias:
                b = [dequant(m.tensor(name(t, i, "bias"))) for t in EXPERT_MATS]
                L.exp_bias = cp.asarray(np.ascontiguousarray(np.concatenate(b, axis=1)))
            if L.exp_qt[0] != L.exp_qt[1]:
                raise DeviceError(
                    f"layer {i}: gate and up experts differ in type "
                    f"({L.exp_qt[0].name}, {L.exp_qt[1].name}); the fused kernel needs one"
                )
            self.layers.append(L)
        self.out_norm = self._vec(MT.OUTPUT_NORM)
        tied = not m.has(name(MT.OUTPUT))  # tied embeddings: one upload serves both
        self.lm_head = self.embd if tied else self._weight(MT.OUTPUT)

    def _load_qkv(self, i: int) -> list[tuple[DeviceWeight, int]]:
        """[(weight, column offset in the q|k|v row)]: one fused weight when types agree."""
        a, m = self.args, self.model
        parts = [m.tensor(t, i) for t in (MT.ATTN_Q, MT.ATTN_K, MT.ATTN_V)]
        biases = None
        if a.qkv_bias:
            biases = [dequant(m.tensor(f"blk.{i}.attn_{n}.bias")) for n in ("q", "k", "v")]
        if len({p.qtype for p in parts}) == 1:
            raw = np.concatenate([p.raw() for p in parts], axis=0)
            b = None if biases is None else np.concatenate(biases)
            w = DeviceWeight(self.cp, raw, parts[0].qtype, raw.shape[0], parts[0].shape[-1], b)
            return [(w, 0)]
        out, off = [], 0
        for j, p in enumerate(parts):
            rows = int(np.prod(p.shape[:-1]))
            b = None if biases is None else biases[j]
            out.append((DeviceWeight(self.cp, p.raw(), p.qtype, rows, p.shape[-1], b), off))
            off += rows
        return out
