"""`CupyTier`: the DeviceTier interface (strata/gpu/tier.py) on the card, with CuPy RawKernels.

Numerics copy HostTier's (and so llama.cpp's): activations are quantized on the device to each
weight's vec_dot type exactly as strata.quant.activation does, the KV cache is f16 (or, with
kv_type="int8", int8 rows with a float32 scale each, rounded as HostTier's int8 cache), q meets
it as f16 and the softmax probabilities are rounded to f16. What differs is float32 summation
order, so logits agree with HostTier to ~1e-5 relative except where a Q8 rounding flips.

Arrays at the boundary: `embed` returns a device (CuPy) array; every other method accepts NumPy
or CuPy and returns the same kind it was given, so the engine's x stays on the card between
calls. Router logits always come back as NumPy (routing runs on the host: the one read-back of
a layer), or, from `router_picks` (a prompt's top-k on the card), the picks; `output` returns
NumPy logits. `router`'s h is a view of a tier buffer, valid until the next `router` call
(passing it back to `experts` reuses its Q8 form).

A prompt runs in chunks of `ptmax` rows (the grouped experts' chunk, 512): its attention
projections, RoPE and router take a chunk at once (on CUDA sm_80+ the quantized projections on
the int8 tensor cores, `gemv.gemm_mma`, and the attention over the f16 cache on the f16 ones,
`attention.attention_mma`; elsewhere the T-row GEMV and attention.cu's kernels over query
chunks of `att_tmax`, its scores workspace).

Memory: dense weights, the KV cache, the workspace and the expert slots are reserved in the
`DeviceBudget` and allocated once; a call allocates only the arrays it returns (from CuPy's
capped pool). Experts live in fixed slots ((layer, expert) -> slot, least recently used out);
a missing expert is uploaded into a slot when it is first needed (synchronously: eager steps);
the adaptive cache's admits upload on a copy stream (`prefetch`), off the compute streams.

T = tokens, D = hidden, H/G = query/KV heads, Dh/Dv = head dims, E = experts, K = used,
F = expert FFN, V = vocab, L = layers, S = context.
"""

from __future__ import annotations

import os
from collections import OrderedDict, deque

import numpy as np
from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import GGMLQuantizationType

from strata.gpu.attention import (
    AttnWorkspace,
    attention,
    attention_decode,
    attention_mma,
    attention_mma_shape_ok,
    dec_grid_for,
)
from strata.gpu.budget import MIB, DeviceBudget
from strata.gpu.decode_graph import GraphDecoder, Pinned
from strata.gpu.device import DeviceError, DeviceInfo, env_switch, import_cupy, primary_device
from strata.gpu.elementwise import sigmoid_scale_rows, silu_mul
from strata.gpu.embed import embed
from strata.gpu.experts import (
    GROUPED_MIN_T,
    SlotStore,
    TileBufs,
    moe_experts,
    moe_experts_grouped,
    tile_pairs,
)
from strata.gpu.gemv import DeviceWeight, dense_mma_nt, gemm_mma, gemv
from strata.gpu.host import EXPERT_MATS, check_kv_type, rope_inv_freq
from strata.gpu.norm_quant import ActBuf, norm_quant
from strata.gpu.pairs_card import GP_THREADS, group_pairs
from strata.gpu.pairs_fast import distinct_experts
from strata.gpu.rawmod import kernels_for
from strata.gpu.rope_kv import qk_norm_rope_kv
from strata.gpu.router_topk import router_topk
from strata.gpu.sample import SampleBufs, sample_logits
from strata.gpu.staging import StageUploader
from strata.model.loader import Model
from strata.model.qwen3moe import name
from strata.model.weights import dequant
from strata.quant import fmt

QT = GGMLQuantizationType
MOE_TMAX = 512  # tokens per chunk of the grouped (prefill) expert kernels (STRATA_GPU_MOE_TMAX);
# 512 against 128 on the H200 with the tensor-core tiles: prefill 292.7 against 305.3 ms, car-on
# 1369-1398 against 1228-1281 tok/s (bench/results/session14-h200-20261130.md)
ATTN_SCORES_BYTES = 64 * MIB  # bound on the attention scores workspace (sets its query chunk)
# adaptive admits staged through pinned memory: uploads that may be in flight before the host
# waits for the oldest (a step admits a few; the card routes to one once its bytes are in)
STAGE_RING = 8


class _Layer:
    __slots__ = (
        "attn_norm", "ffn_norm", "q_norm", "k_norm", "qkv", "o", "router", "sh", "exp_qt",
    )  # fmt: skip


def moe_tmax() -> int:
    """Tokens per chunk of a prompt's grouped expert kernels: MOE_TMAX, or STRATA_GPU_MOE_TMAX
    (an A/B knob: a larger chunk fills the tiles of an expert more, for a larger workspace)."""
    v = os.environ.get("STRATA_GPU_MOE_TMAX", "").strip()
    if not v:
        return MOE_TMAX
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"STRATA_GPU_MOE_TMAX={v!r}: give a positive token count")
    return int(v)


class CupyTier:
    name = "cupy"

    def __init__(
        self,
        model: Model,
        n_ctx: int = 4096,
        budget: DeviceBudget | None = None,
        expert_slots: int | str = "auto",
        device: DeviceInfo | None = None,
        tmax: int = 32,
        kv_type: str = "f16",
        prefill_stage: int = 0,
    ):
        cp = self.cp = import_cupy()
        info = device or primary_device()
        if cp is None or info is None:
            raise DeviceError("no GPU: CupyTier needs CuPy and a device (use the host tier)")
        self.info = info
        self.K = kernels_for(info)
        # a prompt's resident experts and quantized projections on the int8 tensor cores where
        # the card has them (STRATA_GPU_MOE_MMA=0: the dp4a tile kernels and gemv_*, the A/B arm)
        self.moe_mma = env_switch("STRATA_GPU_MOE_MMA") and self.K.int8_mma
        self.dense_nt = dense_mma_nt()  # tokens a tile of gemm_mma (STRATA_GPU_DENSE_MMA_NT)
        self.budget = budget if budget is not None else DeviceBudget.from_env()
        self.budget.install_pool_cap(cp)
        a = self.args = model.args
        self.model, self.n_ctx, self.tmax = model, int(n_ctx), int(tmax)
        self.eps = float(np.float32(a.rms_eps))
        self.dims = (a.n_head, a.n_head_kv, a.head_dim, a.v_head_dim)
        self.qkv_dim = (a.n_head + a.n_head_kv) * a.head_dim + a.n_head_kv * a.v_head_dim
        self.scale = float(np.float32(1.0 / np.sqrt(a.head_dim)))

        self.budget.reserve("weights", self._dense_bytes())
        self._load_dense()
        # KV cache [L, G, S, Dh]: f16 bits, or int8 with a float32 scale per row [L, G, S]
        self.kv_type = check_kv_type(kv_type)
        # a prompt's attention over the f16 cache on the f16 tensor cores where the card has
        # them (STRATA_GPU_ATTN_MMA=0: attention.cu's kernels, the A/B arm)
        self.attn_mma = (
            env_switch("STRATA_GPU_ATTN_MMA")
            and self.K.int8_mma
            and self.kv_type == "f16"
            and attention_mma_shape_ok(self.dims)
        )
        kv_shape = (a.n_layer, a.n_head_kv, self.n_ctx)
        self.budget.reserve("kv", model.kv_bytes(self.n_ctx, self.kv_type))
        kv = np.int8 if self.kv_type == "int8" else np.uint16
        self.k_cache = cp.zeros((*kv_shape, a.head_dim), kv)
        self.v_cache = cp.zeros((*kv_shape, a.v_head_dim), kv)
        self.k_scale = self.v_scale = None
        if self.kv_type == "int8":
            self.k_scale = cp.zeros(kv_shape, np.float32)
            self.v_scale = cp.zeros(kv_shape, np.float32)
        self.inv_freq = cp.asarray(rope_inv_freq(a.head_dim, a.rope_theta))
        self._alloc_workspace()
        self._init_stage(prefill_stage)
        self._init_slots(expert_slots)

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
            L.o = self._weight(MT.ATTN_OUT, i)
            L.router = self._weight(MT.FFN_GATE_INP, i)
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
        self.moe_tmax = max(tm, moe_tmax())
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
        floats += self.moe_rows * (a.expert_ff + 3)  # moe_act, pair_slot/_w, moe_cnt
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
        self.moe_cnt = cp.zeros((self.moe_rows,), np.int32)  # fused-quant MoE counters (stay 0)
        self.tiles = TileBufs(cp, self.moe_rows, a.n_embd)
        # a prompt's experts grouped on the card (moe_on_card): slot_of's copy, pick counts
        self.slot_dev = cp.full((a.n_layer, a.n_expert), -1, np.int32)
        self._slot_dev_version = -1
        self.pick_hist = cp.zeros((a.n_layer, a.n_expert), np.int32)
        self.ids_buf = cp.empty((tm,), np.int32)
        self.pos_buf = cp.zeros((1,), np.int32)  # the decode position, read by the kernels
        self.sample_bufs = SampleBufs(cp, a.n_vocab)  # sampling on the card (eager and graphs)
        self._last_h = None  # (h view handed out by router, layer)

    def graph_decoder(self) -> GraphDecoder:
        """The CUDA-graph decode steps of this tier (built on first use)."""
        if self._graph is None:
            self._graph = GraphDecoder(self)
        return self._graph

    def routes_on_device(self) -> bool:
        """Whether the graph step can route (top-k + CAR) on this card for this model."""
        from strata.gpu.route_car import route_car_supported

        a = self.args
        return route_car_supported(self.K, a.n_expert, a.n_expert_used)

    @property
    def all_resident(self) -> bool:
        return bool((self.slot_of >= 0).all())

    def act(self, n: int, vec_dot) -> ActBuf:
        return self.acts[(n, int(vec_dot))]

    # ---- expert slots ----
    def _expert_slot_bytes(self) -> list[int]:
        """Bytes of one slot per expert matrix (gate, up, down): the largest layer's expert."""
        a, m = self.args, self.model
        per = [[m.tensor(t, i).nbytes // a.n_expert for t in EXPERT_MATS] for i in range(a.n_layer)]
        return [max(p[j] for p in per) for j in range(3)]

    def _init_stage(self, n: int) -> None:
        """Staging slots for a prompt's missed experts (`experts_staged`), reserved before the
        expert cache takes what the budget leaves; 0: none (the CPU pool computes them)."""
        self.stage_n = max(0, min(int(n), self.args.n_expert))
        self.stage_stores = self._stager = None
        self.stage_uploads = 0  # experts uploaded to staging (statistics)
        if self.stage_n:
            sb = self._expert_slot_bytes()
            self.budget.reserve("prefill_stage", self.stage_n * sum(sb))
            self.stage_stores = tuple(SlotStore(self.cp, self.stage_n, b) for b in sb)

    def experts_staged(self, layer: int, h, ids: np.ndarray, weights: np.ndarray):
        """Σ_k weights · expert(h) over ids >= 0 ([T, K]), every expert uploaded to the staging
        slots first, in groups of `stage_n` (the cache's slots stay as they are): a prompt's
        misses computed on the card instead of the CPU pool, as llama.cpp offloads a large
        batch's host-resident weights. The experts' GGUF bytes go up through pinned memory
        (strata/gpu/staging.py), one copy per matrix and group."""
        if not self.stage_n:
            raise DeviceError("experts_staged needs staging slots (prefill_stage > 0)")
        cp, a = self.cp, self.args
        hd, host = self._in(h)
        ids = np.asarray(ids)
        w = np.ascontiguousarray(weights, dtype=np.float32)
        need = np.unique(ids[ids >= 0])
        out = cp.zeros((hd.shape[0], a.n_embd), np.float32)
        tmp = cp.empty_like(out) if need.size > self.stage_n else out
        mats = [self.model.tensor(t, layer).raw() for t in EXPERT_MATS]  # [E*R, row_bytes]
        if self._stager is None:
            self._stager = StageUploader(cp, self._expert_slot_bytes(), self.stage_n)
        for grp in np.array_split(need, -(-need.size // self.stage_n)) if need.size else []:
            self.await_uploads()  # an adaptive prefetch may still be in flight
            stage_of = np.full(a.n_expert, -1, np.int32)
            stage_of[grp] = np.arange(grp.size, dtype=np.int32)
            sent = self._stager.upload(self.stage_stores, mats, a.n_expert, grp)
            self.expert_bytes_uploaded += sent
            self.stage_uploads += grp.size
            slots = np.where(ids >= 0, stage_of[np.maximum(ids, 0)], -1).astype(np.int32)
            self._last_h = None
            self._experts(layer, hd, h, slots, w, tmp, stores=self.stage_stores)
            if tmp is not out:
                out += tmp
        return self._out(out, host)

    def _init_slots(self, expert_slots: int | str) -> None:
        a = self.args
        self.slot_bytes = self._expert_slot_bytes()
        one = sum(self.slot_bytes)
        total = a.n_layer * a.n_expert
        if expert_slots == "auto":
            n = min(total, self.budget.free_bytes // one)
        else:
            n = min(total, int(expert_slots))
        if n < a.n_expert_used:
            raise DeviceError(
                f"the VRAM budget leaves room for {n} expert slots, fewer than the "
                f"{a.n_expert_used} one token needs ({one / MIB:.1f} MiB each)\n"
                + self.budget.table()
            )
        self.budget.reserve("expert_slots", n * one)
        self.n_slots = int(n)
        self.stores = tuple(SlotStore(self.cp, n, b) for b in self.slot_bytes)
        self.slot_of = np.full((a.n_layer, a.n_expert), -1, np.int32)  # (layer, e) -> slot
        self._lru: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._free = list(range(n - 1, -1, -1))
        self.expert_uploads = 0
        self.expert_bytes_uploaded = 0
        self.slot_version = 0  # bumped whenever slot_of changes (the graph's slot table copy)
        self._copy = None  # the copy stream of `prefetch` (made on first use)
        self._pending = None  # the last prefetch's event
        self._admits: deque = deque()  # (layer, e, its upload's event) of uploads maybe in flight
        if n == total:  # everything fits: load it all now, no upload on the hot path
            for i in range(a.n_layer):
                for e in range(a.n_expert):
                    self._upload(i, e)

    def resident_mask(self, layer: int) -> np.ndarray:
        """[E] bool: experts of `layer` in a VRAM slot now (for cache-aware routing)."""
        return self.slot_of[layer] >= 0

    def load_resident(self, mask: np.ndarray) -> np.ndarray:
        """Fill the slots with the experts of `mask` [L, E] (a placement from the usage
        profile), in order, up to the slot count; returns the resident mask [L, E] after."""
        for key in [k for k in self._lru if not mask[k]]:  # a re-placement: unwanted out
            self._free.append(self._lru.pop(key))
            self.slot_of[key] = -1
            self.slot_version += 1
        for i, e in zip(*np.nonzero(mask), strict=True):
            if self.slot_of[i, e] < 0 and (self._free or len(self._lru) >= self.n_slots):
                if not self._free and bool(mask[self._lru_oldest()]):
                    break  # every slot already holds a wanted expert
                self._upload(int(i), int(e))
        return self.slot_of >= 0

    def _lru_oldest(self) -> tuple[int, int]:
        return next(iter(self._lru))

    # the engine's host-side helpers: the CPU pool reads h on the host and returns host rows
    def to_host(self, a) -> np.ndarray:
        return self.cp.asnumpy(a) if isinstance(a, self.cp.ndarray) else np.asarray(a)

    def to_device(self, a):
        return a if isinstance(a, self.cp.ndarray) else self.cp.asarray(a)

    def _upload(self, layer: int, e: int, keep: frozenset = frozenset()) -> int:
        self.await_uploads()  # a prefetch still copying into the slot taken here goes first
        if self._free:
            s = self._free.pop()
        else:
            for key in self._lru:  # least recently used first
                if key[0] != layer or key[1] not in keep:
                    break
            else:
                raise DeviceError("expert cache too small for one layer's picks")
            s = self._lru.pop(key)
            self.slot_of[key] = -1
        for j, t in enumerate(EXPERT_MATS):
            raw = self.model.tensor(t, layer).raw()  # [E*rows, row_bytes]
            per = raw.shape[0] // self.args.n_expert
            src = np.ascontiguousarray(raw[e * per : (e + 1) * per]).reshape(-1)
            self.stores[j].buf[s, : src.nbytes].set(src)
            self.expert_bytes_uploaded += src.nbytes
        self.expert_uploads += 1
        self.slot_of[layer, e] = s
        self._lru[(layer, e)] = s
        self.slot_version += 1
        return s

    def prefetch(self, layer: int, e: int, evict: int | None = None) -> None:
        """Upload expert (layer, e) without blocking the compute streams (adaptive admits):
        staged through pinned memory and copied on a copy stream once the work already queued
        (which may still read the evicted slot) is done; kernels launched later wait for it
        (`await_uploads`). `evict` names the expert of `layer` whose slot it takes."""
        if self.slot_of[layer, e] >= 0:
            return
        cp = self.cp
        if evict is not None and self.slot_of[layer, evict] >= 0:
            key = (layer, int(evict))
        elif self._free:
            key = None
        else:
            key = next(iter(self._lru))
        s = self._free.pop() if key is None else self._lru.pop(key)
        if key is not None:
            self.slot_of[key] = -1
        self.copy_stream()
        for st in (cp.cuda.Stream.null, self._graph.stream if self._graph else None):
            if st is not None:
                self._copy.wait_event(st.record())
        j = self.expert_uploads % STAGE_RING
        if self._stage_ev[j] is not None:
            self._stage_ev[j].synchronize()  # the staging buffer's last copy has left it
        buf, off = self._stage[j].a, 0
        for m, t in enumerate(EXPERT_MATS):
            raw = self.model.tensor(t, layer).raw()  # [E*rows, row_bytes]
            per = raw.shape[0] // self.args.n_expert
            src = raw[e * per : (e + 1) * per].reshape(-1)
            buf[off : off + src.nbytes] = src
            cp.cuda.runtime.memcpyAsync(
                self.stores[m].buf[s].data.ptr,
                buf[off:].ctypes.data,
                src.nbytes,
                cp.cuda.runtime.memcpyHostToDevice,
                self._copy.ptr,
            )
            off += src.nbytes
            self.expert_bytes_uploaded += src.nbytes
        self._stage_ev[j] = self._pending = self._copy.record()
        self._admits.append((layer, e, self._pending))
        self.expert_uploads += 1
        self.slot_of[layer, e] = s
        self._lru[(layer, e)] = s
        self.slot_version += 1

    def copy_stream(self):
        """The stream of `prefetch`'s uploads (made, with its pinned staging, on first use)."""
        if self._copy is None:
            cp = self.cp
            self._copy = cp.cuda.Stream(non_blocking=True)
            n = sum(self.slot_bytes)
            self._stage = [Pinned(cp, (n,), np.uint8) for _ in range(STAGE_RING)]
            self._stage_ev = [None] * STAGE_RING
        return self._copy

    def await_uploads(self, stream=None) -> None:
        """Make `stream` (default: the legacy stream) wait for the prefetches issued so far."""
        ev = self._pending
        if ev is not None:
            (stream or self.cp.cuda.Stream.null).wait_event(ev)
            if ev.done:
                self._pending = None
                self._admits.clear()

    def settled_slots(self) -> tuple[np.ndarray, bool]:
        """The slot table [L, E] with the experts whose uploads are still in flight left out
        (-1), and whether there are any: what a step may read without waiting for the copy
        stream (the graph decoder's routed step admits an expert once its bytes are in)."""
        adm = self._admits
        while adm and adm[0][2].done:  # one copy stream: its events complete in order
            adm.popleft()
        if not adm:
            return self.slot_of, False
        tab = self.slot_of.copy()
        for layer, e, _ in adm:
            tab[layer, e] = -1
        return tab, True

    def sync_uploads(self) -> None:
        """Wait for expert uploads (legacy stream) before another stream reads the slots."""
        self.cp.cuda.Stream.null.synchronize()

    def slots_for(self, layer: int, ids: np.ndarray) -> np.ndarray:
        """Slots of ids [T, K] (uploading missing experts); -1 where ids < 0."""
        need = distinct_experts(ids, self.args.n_expert).tolist()  # ascending
        keep = frozenset(need)
        row = self.slot_of[layer]
        for e in need:
            if row[e] < 0:
                self._upload(layer, e, keep)
            else:
                self._lru.move_to_end((layer, e))
        return np.where(ids >= 0, row[np.maximum(ids, 0)], -1).astype(np.int32)

    # ---- boundary ----
    def _in(self, x) -> tuple[object, bool]:
        cp = self.cp
        if isinstance(x, cp.ndarray):
            return cp.ascontiguousarray(x, dtype=np.float32), False
        return cp.asarray(np.ascontiguousarray(x, dtype=np.float32)), True

    def _out(self, y, to_host: bool):
        return self.cp.asnumpy(y) if to_host else y

    def _chunks(self, t: int, size: int | None = None):
        size = size or self.tmax
        for c0 in range(0, t, size):
            yield c0, min(size, t - c0)

    # ---- the DeviceTier interface ----
    def embed(self, ids: np.ndarray):
        ids = np.asarray(ids, dtype=np.int32).reshape(-1)
        x = self.cp.empty((ids.size, self.args.n_embd), np.float32)
        for c0, n in self._chunks(ids.size):
            self.ids_buf[:n].set(ids[c0 : c0 + n])
            embed(self.K, self.embd, self.ids_buf, n, x[c0 : c0 + n])
        return x

    def attention(self, layer: int, x, pos0: int):
        xd, host = self._in(x)
        t = xd.shape[0]
        if pos0 + t > self.n_ctx:
            raise ValueError(f"context is full: {pos0 + t} tokens > n_ctx {self.n_ctx}")
        out = self.cp.empty_like(xd)
        for c0, n in self._chunks(t, self.ptmax):
            self._attention(layer, xd[c0 : c0 + n], pos0 + c0, out[c0 : c0 + n], n)
        return self._out(out, host)

    def _attention(self, layer: int, x, pos0: int, out, t: int, pos_dev=None) -> None:
        """out[:t] = x + attention(x) at positions pos0.. (t <= ptmax; decode, t = 1: the
        position is read from pos_dev [1] int32 on the device, so the launches can be replayed
        from a graph). The projections and RoPE take all t rows at once; so does attention_mma
        (the f16 tensor cores), while attention.cu's kernels take query chunks of att_tmax rows
        (their scores workspace), each against the keys up to it."""
        K, L, a = self.K, self.layers[layer], self.args
        if t == 1 and pos_dev is None:  # eager decode: the same kernels as the graph step
            pos_dev = self.pos_buf
            pos_dev.set(np.array([pos0], np.int32))
            # and the decode attention the graph step picks for this position (GraphDecoder's
            # _begin): the short kernel's sums are its own, so eager and replayed steps agree
            # bit for bit only if both take it at the same positions
            self.attn_ws.dec_nsplit = dec_grid_for(self.attn_ws, pos0)
        act = self.act(a.n_embd, L.qkv[0][0].vec_dot)
        norm_quant(K, x, t, L.attn_norm, self.eps, act=act)
        flat = self.qkv_buf.reshape(-1)
        for w, off in L.qkv:
            wa = self.act(a.n_embd, w.vec_dot)
            if wa is not act:
                norm_quant(K, x, t, L.attn_norm, self.eps, act=wa)
            self._gemv(w, wa, flat[off:], t, ldo=self.qkv_dim)
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        ks = vs = None  # the int8 cache's row scales [G, S]
        if self.k_scale is not None:
            ks, vs = self.k_scale[layer], self.v_scale[layer]
        qk_norm_rope_kv(
            K,
            self.qkv_buf,
            t,
            self.dims,
            L.q_norm,
            L.k_norm,
            self.eps,
            self.inv_freq,
            pos0,
            self.q_buf,
            kc,
            vc,
            pos_dev=pos_dev,
            k_scale=ks,
            v_scale=vs,
        )
        if pos_dev is not None:
            attention_decode(
                K, self.attn_ws, self.q_buf, kc, vc, pos_dev, self.dims, self.scale, self.o_buf,
                ks, vs,
            )  # fmt: skip
        elif self.attn_mma:  # one launch for the chunk's rows (no scores workspace)
            attention_mma(K, self.q_buf, kc, vc, t, pos0, self.dims, self.scale, self.o_buf)
        else:
            for c0, n in self._chunks(t, self.att_tmax):
                attention(
                    K, self.attn_ws, self.q_buf[c0 : c0 + n], kc, vc, n, pos0 + c0, self.dims,
                    self.scale, self.o_buf[c0 : c0 + n], ks, vs,
                )  # fmt: skip
        oact = self.act(self.o_buf.shape[1], L.o.vec_dot)
        norm_quant(K, self.o_buf, t, act=oact)
        self._gemv(L.o, oact, out, t, resid=x)

    def router(self, layer: int, x):
        h, lg = self._router_chunks(layer, x, picks=False)
        return h, self.cp.asnumpy(lg)  # one read-back a layer: chunks queue without waiting

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
        for group_pairs.cu (STRATA_PREFILL_GROUP_ON_CARD=0: never, the A/B arm)."""
        return (
            self.args.n_expert <= GP_THREADS
            and env_switch("STRATA_PREFILL_GROUP_ON_CARD")
            and self.all_resident
        )

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
        nt = tile_pairs(self.moe_mma)
        self.await_uploads()
        for c0, n in self._chunks(t, pt):
            self._router_into(layer, xd[c0 : c0 + n], h[c0 : c0 + n], n)
            router_topk(
                K, self.rlogits_buf, n, a.n_expert, k, a.norm_topk, ids[: n * k].reshape(n, k),
                w[: n * k].reshape(n, k),
            )  # fmt: skip
            bound = group_pairs(
                K, ids, n * k, self.slot_dev[layer], a.n_expert, nt, self.pair_slot, self.tiles,
                self.pick_hist[layer],
            )  # fmt: skip
            norm_quant(K, h[c0 : c0 + n], n, act=gh)
            moe_experts_grouped(
                K, L.exp_qt, (a.n_embd, a.expert_ff), self.stores, gh, None, self.pair_slot, w,
                self.tiles, self.moe_act, aact, y[c0 : c0 + n], mma=self.moe_mma,
                card=(n, k, bound),
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
                    w_d[c0 : c0 + n],
                )  # fmt: skip
        self._last_h = (h, layer) if small else None
        return self._out(h, host), out

    def _router_into(self, layer: int, x, h, t: int, out=None) -> None:
        """h[:t] = ffn_norm(x) (also quantized for the experts), out[:t] (default rlogits_buf) =
        router(h)."""
        L, a = self.layers[layer], self.args
        eact = self.act(a.n_embd, fmt(L.exp_qt[0]).vec_dot)
        norm_quant(self.K, x, t, L.ffn_norm, self.eps, out_f=h, act=eact)
        self._linear(L.router, h, t, self.rlogits_buf if out is None else out)

    def _gemv(self, w: DeviceWeight, act: ActBuf, out, t: int, resid=None, ldo=None) -> None:
        """gemv, a prompt chunk of quantized weights on the int8 tensor cores where the card has
        them (gemm_mma: the decode step's T = 1 keeps gemv's kernels)."""
        if t > GROUPED_MIN_T and self.moe_mma and w.quantized:
            gemm_mma(self.K, w, act, out, t, resid=resid, ldo=ldo, nt=self.dense_nt)
        else:
            gemv(self.K, w, act, out, t, resid=resid, ldo=ldo)

    def _linear(self, w: DeviceWeight, x, t: int, out, resid=None) -> None:
        """out[:t] = HostTier's _Linear(w)(x[:t]): quantize x for w, then the GEMV."""
        if w.qtype == QT.F32:
            gemv(self.K, w, x, out, t, resid=resid)  # F32: the activation is used as is
            return
        act = self.act(int(x.shape[-1]), w.vec_dot)
        norm_quant(self.K, x, t, act=act)
        self._gemv(w, act, out, t, resid=resid)

    def experts(self, layer: int, h, ids: np.ndarray, weights: np.ndarray):
        hd, host = self._in(h)
        ids = np.asarray(ids)
        w = np.ascontiguousarray(weights, dtype=np.float32)
        need = distinct_experts(ids, self.args.n_expert)
        out = self.cp.empty((hd.shape[0], self.args.n_embd), np.float32)
        if need.size <= self.n_slots:
            self._experts(layer, hd, h, self.slots_for(layer, ids), w, out)
        else:  # more distinct experts than slots (a long prefill, a tiny cache): in passes
            cached, tmp = self._last_h, self.cp.empty_like(out)
            out[...] = 0
            for grp in np.array_split(need, -(-need.size // self.n_slots)):
                sel = np.where(np.isin(ids, grp), ids, -1)
                self._last_h = cached
                self._experts(layer, hd, h, self.slots_for(layer, sel), w, tmp)
                out += tmp
        self._last_h = None
        return self._out(out, host)

    def _experts(
        self, layer: int, hd, h, slots: np.ndarray, w: np.ndarray, out, stores=None
    ) -> None:
        """out = the experts of `slots` [T, K] (in `stores`, default the cache's) on h."""
        t, k = slots.shape
        a, L = self.args, self.layers[layer]
        hact = self.act(a.n_embd, fmt(L.exp_qt[0]).vec_dot)
        cached = self._last_h is not None and self._last_h[1] == layer and self._last_h[0] is h
        self.await_uploads()
        if t > GROUPED_MIN_T:  # a prompt: the pairs grouped by expert, chunks of moe_tmax
            gh = self.acts[(a.n_embd, int(fmt(L.exp_qt[0]).vec_dot), "moe_h")]
            aact = self.acts[(a.expert_ff, int(fmt(L.exp_qt[2]).vec_dot), "moe")]
            for c0, n in self._chunks(t, self.moe_tmax):
                norm_quant(self.K, hd[c0 : c0 + n], n, act=gh)
                sl = slots[c0 : c0 + n]
                self.pair_slot[: n * k].set(sl.reshape(-1))
                self.pair_w[: n * k].set(w[c0 : c0 + n].reshape(-1))
                moe_experts_grouped(
                    self.K,
                    L.exp_qt,
                    (a.n_embd, a.expert_ff),
                    stores or self.stores,
                    gh,
                    sl,
                    self.pair_slot,
                    self.pair_w,
                    self.tiles,
                    self.moe_act,
                    aact,
                    out[c0 : c0 + n],
                    mma=self.moe_mma,
                )
            return
        for c0, n in self._chunks(t):
            if not (cached and c0 == 0 and n == t):
                norm_quant(self.K, hd[c0 : c0 + n], n, act=hact)
            self.pair_slot[: n * k].set(slots[c0 : c0 + n].reshape(-1))
            self.pair_w[: n * k].set(w[c0 : c0 + n].reshape(-1))
            self._moe_pairs(layer, n, k, out[c0 : c0 + n], stores)

    def _moe_pairs(self, layer: int, t: int, k: int, out, stores=None, resid=None) -> None:
        """out[:t] = the experts of pair_slot/pair_w [t*k] on h, quantized in its ActBuf
        (slots of `stores`, default the cache's), + resid[:t] where given."""
        a, L = self.args, self.layers[layer]
        moe_experts(
            self.K,
            L.exp_qt,
            (a.n_embd, a.expert_ff),
            stores or self.stores,
            self.act(a.n_embd, fmt(L.exp_qt[0]).vec_dot),
            self.pair_slot,
            self.pair_w,
            t,
            k,
            self.moe_act,
            self.acts[(a.expert_ff, int(fmt(L.exp_qt[2]).vec_dot), "moe")],
            out,
            cnt=self.moe_cnt,
            resid=resid,
        )

    def shared_expert(self, layer: int, h):
        hd, host = self._in(h)
        t = hd.shape[0]
        L, a = self.layers[layer], self.args
        out = self.cp.zeros((t, a.n_embd), np.float32)
        if L.sh is None:
            return self._out(out, host)
        for c0, n in self._chunks(t):
            self._shared_into(layer, hd[c0 : c0 + n], n, out[c0 : c0 + n])
        return self._out(out, host)

    def _shared_into(self, layer: int, hc, n: int, y) -> None:
        """y[:n] = the sigmoid-gated shared expert of h rows hc[:n] (n <= tmax)."""
        L, a = self.layers[layer], self.args
        fs = a.shared_ff
        g, u, act = self.sh_buf[0], self.sh_buf[1], self.sh_buf[2]
        self._linear(L.sh["gate"], hc, n, g)
        self._linear(L.sh["up"], hc, n, u)
        silu_mul(self.K, g, u, act, n * fs)
        self._linear(L.sh["down"], act[:n], n, y)
        gemv(self.K, L.sh["inp"], hc, self.sh_gate_buf, n)  # h @ sh_inp, unrounded h
        sigmoid_scale_rows(self.K, y, self.sh_gate_buf, n, a.n_embd)

    def output(self, x) -> np.ndarray:
        xd, _ = self._in(x)
        t = xd.shape[0]
        a = self.args
        logits = np.empty((t, a.n_vocab), np.float32)
        act = self.act(a.n_embd, self.lm_head.vec_dot)
        for c0, n in self._chunks(t):
            self._output_into(xd[c0 : c0 + n], n, act)
            logits[c0 : c0 + n] = self.cp.asnumpy(self.logits_buf[:n])
        return logits

    def output_sample(self, x, params, u: float) -> int:
        """Final norm + lm_head of the last row of x, then the sampling chain on the card with
        uniform u (strata/gpu/sample.py): only the token id comes back."""
        xd, _ = self._in(x)
        a = self.args
        self._output_into(xd[-1:], 1, self.act(a.n_embd, self.lm_head.vec_dot))
        return sample_logits(self.K, self.logits_buf, a.n_vocab, self.sample_bufs, params, u)

    def _output_into(self, x, n: int, act: ActBuf) -> None:
        """logits_buf[:n] = lm_head(output_norm(x[:n]))."""
        if self.lm_head.qtype == QT.F32:
            norm_quant(self.K, x, n, self.out_norm, self.eps, out_f=self.xn_buf)
            gemv(self.K, self.lm_head, self.xn_buf, self.logits_buf, n)
        else:
            norm_quant(self.K, x, n, self.out_norm, self.eps, act=act)
            self._gemv(self.lm_head, act, self.logits_buf, n)
