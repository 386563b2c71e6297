"""Resident experts of a layer in one pass over the (token, slot, weight) list
(kernels/experts.cu): slot storage, launcher, NumPy reference.

T = tokens, K = experts per token, P = T*K pairs, D = hidden, F = expert FFN size, S = slots.
Decode kernels: by the experts' type (MOE_KERNELS_BY_TYPE). gpt-oss: `bias` [E, 2F + D]
float32 (each expert's gate, up and down biases) with `pair_exp` [P] int32 (each pair's expert),
and `oai` (the clamped SwiGLU), both on the dp4a kernels only (kernels/moe_glu.cuh).
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from strata.gpu.gemv import MMA_NT, MMA_WARPS, Q_NAMES
from strata.gpu.norm_quant import ActBuf, norm_quant, xd_shift
from strata.gpu.pairs_fast import group_pairs_into
from strata.gpu.rawmod import NULL, Kernels, i32, i64, ptr
from strata.quant import fmt
from strata.quant.activation import roundtrip

QT = GGMLQuantizationType
MOE_ACT_SILU, MOE_ACT_OAI = 0, 1  # moe_glu.cuh
THREADS = 128
ST_WARPS = 4  # experts.cu MOE_ST_WARPS: warps a block of moe_gate_up_st1

# Decode (T <= GROUPED_MIN_T) kernels by the gate/up experts' type: (gate/up, down). moe_gate_up /
# moe_down: one warp a row, weights read straight from global memory; moe_gate_up_st1: the row's
# chunks staged through shared memory with 16-byte loads (ST_WARPS warps a block); moe_down_sp2:
# two warps a row, warp 0 adding the other's items in moe_down's order (a row of more than SP_IT
# warp-widths of items runs moe_down). The same sums in the same order whichever pair. st1 took
# 4-26% off the MoE time of IQ3_XXS, Q4_K, Q6_K, IQ1_M at T = 1 and 4 on the H200 but cost Q8_0
# 5-11%; sp2 took 1-10% off every type's layer but IQ1_M's (level).
DEFAULT_MOE_KERNELS = ("moe_gate_up_st1", "moe_down_sp2")
MOE_KERNELS_BY_TYPE = {
    QT.Q8_0: ("moe_gate_up", "moe_down_sp2"),
    QT.IQ3_XXS: ("moe_gate_up", "moe_down_sp2"),
    QT.IQ2_XXS: ("moe_gate_up", "moe_down_sp2"),
    QT.IQ2_S: ("moe_gate_up", "moe_down_sp2"),
    QT.IQ1_M: ("moe_gate_up_st1", "moe_down"),
}
SP_IT = 16  # experts.cu MOE_SP_IT: item iterations a row of moe_down_sp2 holds at most
SP_WARPS = 2  # moe_down_sp2's warps a row
SP_ROWS = 2  # experts.cu MOE_SP_R(2): rows a block of moe_down_sp2


def moe_kernels(qtype) -> tuple[str, str]:
    """The decode (gate/up, down) kernel names for gate/up experts of `qtype`."""
    return MOE_KERNELS_BY_TYPE.get(QT(int(qtype)), DEFAULT_MOE_KERNELS)


def gate_up_launch(K: Kernels, gu: str, f: int, pairs: int) -> tuple[tuple, tuple]:
    """(grid, block) of the gate/up kernel `gu` for F = f and `pairs` (T * K) pairs: st1 runs
    ST_WARPS warps of one row each, moe_gate_up THREADS threads of one row a warp."""
    if gu == "moe_gate_up_st1":
        return (-(-f // ST_WARPS), pairs), (ST_WARPS * K.warp,)
    wpb = K.warps_per_block(THREADS)
    return (-(-f // wpb), pairs), (wpb * K.warp,)


def down_launch(K: Kernels, dn: str, d: int, t: int, k: int, f: int) -> tuple[str, tuple, tuple]:
    """(kernel name, grid, block) of the down kernel `dn` for D = d, T = t, K = k, F = f:
    moe_down_sp2 runs SP_ROWS rows of two warps a block, and falls back to moe_down where a
    row's K * F / 32 items exceed SP_IT warp-widths."""
    if dn == "moe_down_sp2" and -(-k * (f // 32) // K.warp) <= SP_IT:
        return dn, (-(-d // SP_ROWS), t), (SP_ROWS * SP_WARPS * K.warp,)
    rows = K.warps_per_block(THREADS)
    return "moe_down", (-(-d // rows), t), (rows * K.warp,)


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
    resid=None,
    bias=None,
    pair_exp=None,
    oai: bool = False,
) -> None:
    """out[:t] = sum_k pair_w[t, k] * expert_{pair_slot[t, k]}(h[t]) (+ resid[:t], the residual
    add in the down kernel, where nothing else joins the sum); hact holds h quantized for
    the gate/up vec_dot, act [P, F] float32 and aact [P, F] are the intermediate's buffers;
    bias, pair_exp, oai: gpt-oss's (module docstring)."""
    qg, qu, qd = (QT(int(q)) for q in qtypes)
    if qg != qu:
        raise ValueError(f"gate ({qg.name}) and up ({qu.name}) experts must share a type")
    d, f = dims
    gate, up, down = stores
    gu, dn = moe_kernels(qg)
    glu = (ptr(bias), ptr(pair_exp), i32(MOE_ACT_OAI if oai else MOE_ACT_SILU))
    args = (gate.buf, up.buf, i64(gate.slot_bytes), hact.q, hact.d, i32(xd_shift(hact.mode)),
            pair_slot, i32(k), act, i32(f), i32(d), *glu)  # fmt: skip
    gu_grid, gu_block = gate_up_launch(K, gu, f, t * k)
    K.fn("experts.cu", f"{gu}_{Q_NAMES[qg]}")(gu_grid, gu_block, args)
    norm_quant(K, act, t * k, act=aact)  # the intermediate, Q8 as ggml quantizes it
    dname, dgrid, dblock = down_launch(K, dn, d, t, k, f)
    K.fn("experts.cu", f"{dname}_{Q_NAMES[qd]}")(
        dgrid,
        dblock,
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
            ptr(resid),
            *glu[:2],
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


MOE_NT = 8  # pairs per tile in experts_grouped.cu
GROUPED_MIN_T = 8  # more tokens than this: the grouped (prefill) kernels


def tile_pairs(mma: bool) -> int:
    """Pairs a tile of the grouped kernels: MMA_NT (experts_mma.cu) or MOE_NT (dp4a)."""
    return MMA_NT if mma else MOE_NT


def group_pairs(slots: np.ndarray, nt: int = MOE_NT):
    """Tiles of up to `nt` pairs sharing an expert slot, from slots [T, K] (pair p = t*K + k;
    slot < 0 = skipped) -> (pair_order [P'], tile_slot, tile_first, tile_n [tiles]) int32, the
    pairs sorted by slot (stable), each tile a run of pair_order."""
    flat = np.asarray(slots, dtype=np.int32).reshape(-1)
    valid = np.flatnonzero(flat >= 0)
    order = valid[np.argsort(flat[valid], kind="stable")].astype(np.int32)
    s = flat[order]
    if s.size == 0:
        e = np.zeros(0, np.int32)
        return order, e, e, e
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    ends = np.r_[starts[1:], s.size]
    per = -(-(ends - starts) // nt)  # tiles per run
    first_of_run = np.repeat(np.cumsum(per) - per, per)
    tile_first = np.repeat(starts, per) + nt * (np.arange(per.sum()) - first_of_run)
    tile_n = np.minimum(nt, np.repeat(ends, per) - tile_first)
    return order, s[tile_first], tile_first.astype(np.int32), tile_n.astype(np.int32)


class TileBufs:
    """Device buffers of the grouped kernels for up to `pairs` pairs: the sorted pair order,
    the tiles (rows of one [4, pairs] int32 array, filled on the host in `host` and copied at
    once, or on the card by pairs_card.group_pairs, which also writes the tile count), and the
    per-pair down outputs y [pairs, D]."""

    def __init__(self, cp, pairs: int, d: int):
        self.host = np.zeros((4, pairs), np.int32)
        self.dev = cp.zeros((4, pairs), np.int32)
        self.order, self.slot, self.first, self.n = self.dev
        self.count = cp.zeros((1,), np.int32)  # the tiles grouped on the card
        self.y = cp.zeros((pairs, d), np.float32)

    @staticmethod
    def bytes_for(pairs: int, d: int) -> int:
        return 4 * pairs * (4 + d) + 4


def moe_experts_grouped(
    K: Kernels,
    qtypes: tuple,
    dims: tuple[int, int],
    stores: tuple[SlotStore, SlotStore, SlotStore],
    hact: ActBuf,
    slots,
    pair_slot,
    pair_w,
    tiles: TileBufs,
    act,
    aact: ActBuf,
    out,
    mma: bool = False,
    card: tuple[int, int, int] | None = None,
    bias=None,
    pair_exp=None,
    oai: bool = False,
) -> None:
    """out[:T] = sum_k pair_w[t, k] * expert_{slots[t, k]}(h[t]) for slots [T, K] (host) with the
    pairs grouped by expert (kernels/experts_grouped.cu; with `mma`, tiles of MMA_NT pairs on
    the int8 tensor cores, kernels/experts_mma.cu: CUDA sm_80+, `Kernels.int8_mma`);
    pair_slot/pair_w [T*K] on the device already hold the same slots and the weights.
    card = (T, K, tile bound): the pairs are already grouped on the card into `tiles`
    (pairs_card.group_pairs with nt = `tile_pairs(mma)`, which returns the bound; slots unused):
    nothing goes between host and card, the kernels read the tile count there. bias, pair_exp,
    oai: gpt-oss's (module docstring), on the dp4a tiles only."""
    qg, qu, qd = (QT(int(q)) for q in qtypes)
    if qg != qu:
        raise ValueError(f"gate ({qg.name}) and up ({qu.name}) experts must share a type")
    d, f = dims
    if card is None:
        t, k = slots.shape
        _, n_tiles = group_pairs_into(slots, tile_pairs(mma), tiles.host)
        if n_tiles:
            tiles.dev.set(tiles.host)  # one copy (the rows' tails past m / n_tiles unused)
        count = NULL
    else:
        (t, k, n_tiles), count = card, tiles.count
    gate, up, down = stores
    glu = (ptr(bias), ptr(pair_exp), i32(MOE_ACT_OAI if oai else MOE_ACT_SILU))
    if mma and (bias is not None or oai):
        raise ValueError("the MMA expert tiles have no expert biases or clamped SwiGLU")
    if mma:  # 16 weight rows a warp
        src, names = "experts_mma.cu", ("gate_up_mma", "down_mma")
        rows, block = 16 * MMA_WARPS, (32 * MMA_WARPS,)
    else:  # a weight row a warp
        src, names = "experts_grouped.cu", ("gate_up_tiles", "down_tiles")
        rows = K.warps_per_block(THREADS)
        block = (rows * K.warp,)
    if n_tiles:
        tile_args = (tiles.slot, tiles.first, tiles.n, tiles.order)
        K.fn(src, f"moe_{names[0]}_{Q_NAMES[qg]}")(
            (-(-f // rows), n_tiles),
            block,
            (
                gate.buf,
                up.buf,
                i64(gate.slot_bytes),
                hact.q,
                hact.d,
                i32(xd_shift(hact.mode)),
                *tile_args,
                i32(k),
                act,
                i32(f),
                i32(d),
                count,
                *(() if mma else glu),
            ),
        )
        norm_quant(K, act, t * k, act=aact)  # the intermediate, Q8 as ggml quantizes it
        K.fn(src, f"moe_{names[1]}_{Q_NAMES[qd]}")(
            (-(-d // rows), n_tiles),
            block,
            (
                down.buf,
                i64(down.slot_bytes),
                aact.q,
                aact.d,
                i32(xd_shift(aact.mode)),
                *tile_args,
                tiles.y,
                i32(d),
                i32(f),
                *((NULL, NULL, i32(d)) if mma else ()),
                count,
                *(() if mma else glu[:2]),
            ),
        )
    K.fn("experts_grouped.cu", "moe_sum_pairs")(
        (-(-d // 256), t), (256,), (tiles.y, pair_slot, pair_w, i32(k), i32(d), out)
    )
