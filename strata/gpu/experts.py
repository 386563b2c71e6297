"""Resident experts of a layer in one pass over the (token, slot, weight) list
(kernels/experts.cu): slot storage, launcher, NumPy reference.

T = tokens, K = experts per token, P = T*K pairs, D = hidden, F = expert FFN size, S = slots.
Decode kernels: MOE_VARIANT ("<gate/up>+<down>", STRATA_MOE_VARIANT overrides the default).
"""

from __future__ import annotations

import os

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from strata.gpu.gemv import MMA_NT, MMA_WARPS, Q_NAMES
from strata.gpu.norm_quant import MODES, ActBuf, norm_quant, xd_shift
from strata.gpu.pairs_fast import group_pairs_into
from strata.gpu.rawmod import NULL, Kernels, i32, i64, ptr
from strata.quant import fmt
from strata.quant.activation import roundtrip

QT = GGMLQuantizationType
THREADS = 128
ST_WARPS = 4  # experts.cu MOE_ST_WARPS: warps a block of the staged (*_st*) kernels

# Decode (T <= GROUPED_MIN_T) kernel pairs, "<gate/up>+<down>": legacy = moe_gate_up / moe_down
# (one warp a row, weights read straight from global memory); st1 / st2 = moe_gate_up_st1/2
# (1 or 2 rows a warp, row chunks staged through shared memory with 16-byte loads); st =
# moe_down_st; fq = moe_gate_up_fq (moe_gate_up that also quantizes the intermediate, the last
# block of each pair through a counter: no separate norm_quant launch, the same bits); gs =
# moe_gate_up_gs (gate and up of a row on two warps, each summed as moe_gate_up sums it); sp2 /
# sp3 / sp6 = moe_down_sp<W> (W warps a row, warp 0 adding the others' items in moe_down's order;
# a row of more than SP_IT warp-widths of items runs moe_down). Same sums in the same order;
# bench/experts_decode_sweep.py times them.
GATE_UP_VARIANTS = {"legacy": ("moe_gate_up", 0), "st1": ("moe_gate_up_st1", 1),
                    "st2": ("moe_gate_up_st2", 2), "fq": ("moe_gate_up_fq", 0),
                    "gs": ("moe_gate_up_gs", 0)}  # fmt: skip
FUSED_QUANT = {"fq"}  # gate/up variants that quantize the intermediate themselves (need `cnt`)
DOWN_VARIANTS = {"legacy": "moe_down", "st": "moe_down_st", "sp2": "moe_down_sp2",
                 "sp3": "moe_down_sp3", "sp6": "moe_down_sp6"}  # fmt: skip
SP_IT = 16  # experts.cu MOE_SP_IT: item iterations a row of moe_down_sp<W> holds at most


def gate_up_launch(K: Kernels, gu: str, f: int, pairs: int) -> tuple[str, tuple, tuple]:
    """(kernel name prefix, grid, block) of the gate/up kernel `gu` for F = f and `pairs` (T * K)
    pairs: the staged kernels ST_WARPS warps of `rows` rows each, the others THREADS threads of
    one row a warp, or (gs) one row a pair of warps."""
    name, rows = GATE_UP_VARIANTS[gu]
    if rows:
        return name, (-(-f // (ST_WARPS * rows)), pairs), (ST_WARPS * K.warp,)
    wpb = K.warps_per_block(THREADS)
    return name, (-(-f // (wpb // 2 if gu == "gs" else wpb)), pairs), (wpb * K.warp,)


def down_launch(K: Kernels, dn: str, d: int, t: int, k: int, f: int) -> tuple[str, tuple, tuple]:
    """(kernel name prefix, grid, block) of the down kernel `dn` for D = d, T = t, K = k,
    F = f: moe_down_sp<W> runs MOE_SP_R(W) rows of W warps a block, and falls back to moe_down
    where a row's K * F / 32 items exceed SP_IT warp-widths."""
    if dn.startswith("sp"):
        w = int(dn[2:])
        if -(-k * (f // 32) // K.warp) <= SP_IT:
            rows = 1 if w >= 4 else 4 // w
            return DOWN_VARIANTS[dn], (-(-d // rows), t), (rows * w * K.warp,)
        dn = "legacy"
    rows = K.warps_per_block(THREADS) if dn == "legacy" else ST_WARPS
    return DOWN_VARIANTS[dn], (-(-d // rows), t), (rows * K.warp,)


# the engine's choice by the gate/up experts' type (STRATA_MOE_VARIANT overrides it for all):
# st1+sp2; legacy+sp2 for Q8_0 (whose plain loads the staging only slows), IQ3_XXS, IQ2_XXS and
# IQ2_S; st1+legacy for IQ1_M. On the H200 (bench/results/session7-h200-20261130.md) st1 took
# 4-26% off the T = 1 and T = 4 MoE time of IQ3_XXS, Q4_K, Q6_K, IQ1_M, was level for IQ4_XS and
# IQ2_XXS and cost Q8_0 5-11%. Session 28 (bench/results/session28-h200-20261204.md, call VD: a
# decode layer's MoE at T = 1, graph + PDL) measured the down kernel sp2 against moe_down: best
# pair against st1+legacy 0.90x-0.99x for every type (IQ3_XXS legacy+sp2 0.92x, Q4_K 0.97x) but
# IQ1_M (level: kept); the all-resident IQ3_XXS engine went 337.0 / 332.0 -> 347.5 / 347.6 tok/s.
DEFAULT_MOE_VARIANT = "st1+sp2"
MOE_VARIANT_BY_TYPE = {
    QT.Q8_0: "legacy+sp2",
    QT.IQ3_XXS: "legacy+sp2",
    QT.IQ2_XXS: "legacy+sp2",
    QT.IQ2_S: "legacy+sp2",
    QT.IQ1_M: "st1+legacy",
}
MOE_VARIANT = os.environ.get("STRATA_MOE_VARIANT")


def default_variant(qtype) -> str:
    """The decode kernel pair for gate/up experts of `qtype`: STRATA_MOE_VARIANT, else by type."""
    return MOE_VARIANT or MOE_VARIANT_BY_TYPE.get(QT(int(qtype)), DEFAULT_MOE_VARIANT)


def parse_variant(variant: str | None, qtype) -> tuple[str, str]:
    """'st2+st' -> ('st2', 'st'); a lone gate/up name keeps the legacy down kernel; None: the
    default for gate/up experts of `qtype`."""
    name = variant or default_variant(qtype)
    gu, _, dn = name.partition("+")
    dn = dn or "legacy"
    if gu not in GATE_UP_VARIANTS or dn not in DOWN_VARIANTS:
        src = "" if variant else " (STRATA_MOE_VARIANT)"
        raise ValueError(f"unknown MoE decode variant {name!r}{src} (gate/up: "
                         f"{sorted(GATE_UP_VARIANTS)}, down: {sorted(DOWN_VARIANTS)})")  # fmt: skip
    return gu, dn


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
    variant: str | None = None,
    cnt=None,
    resid=None,
) -> None:
    """out[:t] = sum_k pair_w[t, k] * expert_{pair_slot[t, k]}(h[t]) (+ resid[:t], the residual
    add in the down kernel, where nothing else joins the sum); hact holds h quantized for
    the gate/up vec_dot, act [P, F] float32 and aact [P, F] are the intermediate's buffers.
    `variant`: the decode kernels, "<gate/up>+<down>" (default MOE_VARIANT). `cnt`: int32 [>= P]
    zeros, the per-pair counters of a fused-quant gate/up (left zeroed after every launch, so a
    fixed buffer serves every call and graph replay); None: one kept with aact (fq_counters)."""
    qg, qu, qd = (QT(int(q)) for q in qtypes)
    if qg != qu:
        raise ValueError(f"gate ({qg.name}) and up ({qu.name}) experts must share a type")
    d, f = dims
    gate, up, down = stores
    gu, dn = parse_variant(variant, qg)
    args = (gate.buf, up.buf, i64(gate.slot_bytes), hact.q, hact.d, i32(xd_shift(hact.mode)),
            pair_slot, i32(k), act, i32(f), i32(d))  # fmt: skip
    if gu in FUSED_QUANT:  # the intermediate quantized by the gate/up kernel itself
        if cnt is None:
            cnt = fq_counters(K, aact)
        if cnt.size < t * k or aact.tmax < t * k:
            raise ValueError(f"fused-quant MoE: {t * k} pairs for {cnt.size} counters / "
                             f"{aact.tmax} intermediate rows")  # fmt: skip
        args += (aact.q, aact.d, i32(MODES[aact.mode]), cnt)
    gu_name, gu_grid, gu_block = gate_up_launch(K, gu, f, t * k)
    K.fn("experts.cu", f"{gu_name}_{Q_NAMES[qg]}")(gu_grid, gu_block, args)
    if gu not in FUSED_QUANT:
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
        ),
    )


def fq_counters(K: Kernels, aact: ActBuf):
    """The fused-quant counters kept with `aact` ([aact.tmax] int32 zeros), allocated on its first
    use: for callers without a workspace of their own (tests, benches; CupyTier passes its own
    preallocated moe_cnt)."""
    c = getattr(aact, "fq_cnt", None)
    if c is None:
        c = aact.fq_cnt = K.cp.zeros((aact.tmax,), np.int32)
    return c


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
) -> None:
    """out[:T] = sum_k pair_w[t, k] * expert_{slots[t, k]}(h[t]) for slots [T, K] (host) with the
    pairs grouped by expert (kernels/experts_grouped.cu; with `mma`, tiles of MMA_NT pairs on
    the int8 tensor cores, kernels/experts_mma.cu: CUDA sm_80+, `Kernels.int8_mma`);
    pair_slot/pair_w [T*K] on the device already hold the same slots and the weights.
    card = (T, K, tile bound): the pairs are already grouped on the card into `tiles`
    (pairs_card.group_pairs with nt = `tile_pairs(mma)`, which returns the bound; slots unused):
    nothing goes between host and card, the kernels read the tile count there."""
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
            ),
        )
    K.fn("experts_grouped.cu", "moe_sum_pairs")(
        (-(-d // 256), t), (256,), (tiles.y, pair_slot, pair_w, i32(k), i32(d), out)
    )
