"""Resident experts of a layer in one pass over the (token, slot, weight) list
(kernels/experts.cu): slot storage, launcher, NumPy reference.

T = tokens, K = experts per token, P = T*K pairs, D = hidden, F = expert FFN size, S = slots.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from strata.gpu.gemv import Q_NAMES
from strata.gpu.norm_quant import ActBuf, norm_quant, xd_shift
from strata.gpu.rawmod import Kernels, i32, i64
from strata.quant import fmt
from strata.quant.activation import roundtrip

QT = GGMLQuantizationType
THREADS = 128


class SlotStore:
    """Fixed expert slots of one matrix kind: [S, slot_bytes] uint8 on the device."""

    def __init__(self, cp, n_slots: int, slot_bytes: int):
        self.n, self.slot_bytes = n_slots, slot_bytes
        self.buf = cp.empty((max(n_slots, 1), slot_bytes), np.uint8)


def moe_experts(
    K: Kernels,
    qtypes: tuple,
    dims: tuple[int, int],
    stores: tuple[SlotStore, SlotStore, SlotStore],
    hact: ActBuf,
    pair_slot,
    pair_w,
    t: int,
    k: int,
    act,
    aact: ActBuf,
    out,
) -> None:
    """out[:t] = sum_k pair_w[t, k] * expert_{pair_slot[t, k]}(h[t]); hact holds h quantized for
    the gate/up vec_dot, act [P, F] float32 and aact [P, F] are the intermediate's buffers."""
    qg, qu, qd = (QT(int(q)) for q in qtypes)
    if qg != qu:
        raise ValueError(f"gate ({qg.name}) and up ({qu.name}) experts must share a type")
    d, f = dims
    gate, up, down = stores
    wpb = K.warps_per_block(THREADS)
    block = (wpb * K.warp,)
    K.fn("experts.cu", f"moe_gate_up_{Q_NAMES[qg]}")(
        (-(-f // wpb), t * k),
        block,
        (
            gate.buf,
            up.buf,
            i64(gate.slot_bytes),
            hact.q,
            hact.d,
            i32(xd_shift(hact.mode)),
            pair_slot,
            i32(k),
            act,
            i32(f),
            i32(d),
        ),
    )
    norm_quant(K, act, t * k, act=aact)  # the intermediate, Q8 as ggml quantizes it
    K.fn("experts.cu", f"moe_down_{Q_NAMES[qd]}")(
        (-(-d // wpb), t),
        block,
        (
            down.buf,
            i64(down.slot_bytes),
            aact.q,
            aact.d,
            i32(xd_shift(aact.mode)),
            pair_slot,
            pair_w,
            i32(k),
            out,
            i32(d),
            i32(f),
        ),
    )


def expert_ref(h, gate_raw, up_raw, down_raw, qtypes) -> np.ndarray:
    """HostTier's one-expert math on h [n, D] -> [n, D]."""
    qg, qu, qd = (QT(int(q)) for q in qtypes)
    gate = dequantize(gate_raw, qg).reshape(gate_raw.shape[0], -1)
    up = dequantize(up_raw, qu).reshape(up_raw.shape[0], -1)
    down = dequantize(down_raw, qd).reshape(down_raw.shape[0], -1)
    g = roundtrip(h, fmt(qg).vec_dot) @ gate.T
    u = roundtrip(h, fmt(qu).vec_dot) @ up.T
    a = g / (np.float32(1.0) + np.exp(-g)) * u
    return roundtrip(a, fmt(qd).vec_dot) @ down.T


def pairs_from_topk(K: Kernels, ids, weights, slot_row, n: int, pair_slot, pair_w) -> None:
    """pair_slot[:n] = slot_row[ids[:n]], pair_w[:n] = weights[:n] (all on the device)."""
    K.fn("experts.cu", "moe_pairs_from_topk")(
        (-(-n // THREADS),), (THREADS,), (ids, weights, slot_row, i32(n), pair_slot, pair_w)
    )
