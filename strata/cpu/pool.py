"""The CPU expert pool: one layer's missed experts, all three matrices, in one jitted call.

    # T = tokens, D = hidden dim, F = expert FFN dim, E = experts, N = (token, expert) tasks
    out[t] = sum_{tasks j of token t, by expert} weight[j] * down_e(silu(gate_e(x_t)) * up_e(x_t))

with the roundings of llama.cpp's CPU matmul (`HostTier.experts` is the NumPy statement of it):
x quantized once to the gate/up weights' vec_dot type, the intermediate quantized to the down
weights' vec_dot type. Phases inside the one jitted function:

    0. tasks grouped by expert (counting sort, ascending expert ids)       serial, tiny
    1. quantize x [T, D]                                                   parallel over tokens
    2. gate + up + SiLU.up: items (active expert, F-row chunk), split by   parallel
       cost into one contiguous run per thread
    3. quantize the intermediate [N, F]                                    parallel over tasks
    4. down + weighted sum: D rows split evenly, all active experts        parallel

Phases 1 and 3 run on the calling thread below `quant_min_tasks` rows, or always with
parallel_quant off (STRATA_POOL_PARALLEL_QUANT=0: the sequential A/B arm). The threshold
(STRATA_POOL_QUANT_MIN_TASKS) defaults to 16: a parallel region costs ~4-5 us to launch on the
2-core dev box and quantizing one 768-wide row ~0.8 us, so below ~13-16 rows a region costs
more than it saves (at N = 8 and 16 the two arms measured equal within noise).

Each output element is summed by exactly one thread, in ascending expert order from zero (as
HostTier does), so results are deterministic and do not depend on the thread count. Rows are
prefetched a few rows ahead (`PREFETCH_ROWS`): measured, the hardware prefetcher alone left the
kernels at ~60% of the single-core read bandwidth. Workspaces are allocated on the first call
and when a larger shape arrives; nothing else is allocated per call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numba
import numpy as np
from numba import literally, njit, prange

from strata.cpu.kernels.dispatch import dot, specialized
from strata.cpu.kernels.simd import prefetch_row
from strata.cpu.layout import ExpertMatrix, prepare_tensor
from strata.cpu.quantize import alloc_act, quantize_row

ERR_TOKEN, ERR_EXPERT = 1, 2


@dataclass(frozen=True)
class LayerWeights:
    gate: ExpertMatrix  # [E, F, D]
    up: ExpertMatrix  # [E, F, D]
    down: ExpertMatrix  # [E, D, F]
    expert_nbytes: int = 0
    expert_gguf_bytes: int = 0

    def __post_init__(self):
        g, u, d = self.gate, self.up, self.down
        e, f, dim = g.n_expert, g.rows, g.cols
        shapes = [(m.n_expert, m.rows, m.cols) for m in (u, d)]
        if shapes != [(e, f, dim), (e, dim, f)]:
            raise ValueError(
                f"expert shapes do not fit: gate {[e, f, dim]}, up {[u.n_expert, u.rows, u.cols]},"
                f" down {[d.n_expert, d.rows, d.cols]} (want down [E, D, F])"
            )
        mats = (g, u, d)
        # bytes the kernels read for one expert (gate + up + down), and in the GGUF encoding
        object.__setattr__(self, "expert_nbytes", sum(m.expert_nbytes for m in mats))
        object.__setattr__(self, "expert_gguf_bytes", sum(m.expert_gguf_bytes for m in mats))


def prepare_layer(
    gate, up, down, layout: str | None = None, simd: bool | None = None
) -> LayerWeights:
    """LayerWeights from three expert tensors (TensorRef-like or ExpertMatrix)."""
    return LayerWeights(*(prepare_tensor(t, layout, simd) for t in (gate, up, down)))


def _env_flag(name: str, default: bool) -> bool:
    v = os.environ.get(name)
    return default if v is None else v.strip().lower() not in ("0", "false", "off", "no", "")


PREFETCH_ROWS = 3  # software prefetch distance: the hardware prefetcher alone left ~40% idle


@njit(cache=True)
def _gate_up_items(
    tid, nt, na, f, chunk, tok, order, start, cnt, active, gk, gw, actg, uk, uw, actu, h
):
    """Thread tid's contiguous share of the (expert, F-row chunk) items of phase 2.

    Items are split by cost (tokens of the expert) into nt contiguous runs, so each thread
    streams whole stretches of one expert's rows and the prefetch ahead lands in its own work.
    """
    nch = (f + chunk - 1) // chunk
    total = 0
    for ia in range(na):
        e = active[ia]
        total += (cnt[e] - start[e]) * nch
    lo = tid * total // nt
    hi = (tid + 1) * total // nt
    pos = 0
    for ia in range(na):
        e = active[ia]
        n_e = cnt[e] - start[e]
        for c in range(nch):
            if pos >= lo and pos < hi:
                r0 = c * chunk
                for r in range(r0, min(f, r0 + chunk)):
                    wr = e * f + r
                    if r + PREFETCH_ROWS < f:
                        prefetch_row(gw, wr + PREFETCH_ROWS, gw.shape[1])
                        prefetch_row(uw, wr + PREFETCH_ROWS, uw.shape[1])
                    for p in range(start[e], cnt[e]):
                        t = tok[order[p]]
                        g = dot(gk, gw, wr, actg[0], actg[1], actg[2], actg[3], actg[4], t)
                        u = dot(uk, uw, wr, actu[0], actu[1], actu[2], actu[3], actu[4], t)
                        h[p, r] = g / (np.float32(1.0) + np.exp(-g)) * u
            pos += n_e


@njit(cache=True)
def _down_items(tid, nt, na, dim, chunk, tok, wt, order, start, cnt, active, dk, dw, acth, out):
    """Thread tid's contiguous share of the D rows of phase 4, every active expert ascending."""
    hq, hd, hb, h8, hf = acth
    t_n = out.shape[0]
    lo = tid * dim // nt
    hi = (tid + 1) * dim // nt
    for r0 in range(lo, hi, chunk):
        r1 = min(hi, r0 + chunk)
        for t in range(t_n):
            for r in range(r0, r1):
                out[t, r] = 0
        for ia in range(na):  # experts outer: each expert's rows stream; sums stay in e order
            e = active[ia]
            for r in range(r0, r1):
                wr = e * dim + r
                if r + PREFETCH_ROWS < r1:
                    prefetch_row(dw, wr + PREFETCH_ROWS, dw.shape[1])
                elif ia + 1 < na:  # the next expert's first rows of this chunk
                    prefetch_row(
                        dw, active[ia + 1] * dim + r0 + (r + PREFETCH_ROWS - r1), dw.shape[1]
                    )
                for p in range(start[e], cnt[e]):
                    j = order[p]
                    y = dot(dk, dw, wr, hq, hd, hb, h8, hf, p)
                    out[tok[j], r] += wt[j] * y


@njit(cache=True, parallel=True)
def _run_layer(
    x,
    tok,
    ex,
    wt,
    gw,
    gk,
    uw,
    uk,
    dw,
    dk,
    n_expert,
    ag,
    actg,
    au,
    actu,
    ad,
    acth,
    h,
    order,
    cnt,
    start,
    active,
    out,
    nt,
    par_quant,
    min_tasks,
    chunk,
    stats,
):
    literally(gk)  # one compiled specialization per kernel triple, holding only those kernels
    literally(uk)
    literally(dk)
    t_n = x.shape[0]
    n = tok.shape[0]
    f = gw.shape[0] // n_expert
    dim = dw.shape[0] // n_expert
    # ---- 0. group the tasks by expert (ascending), check ids
    stats[0] = 0
    stats[1] = 0
    for e in range(n_expert):
        cnt[e] = 0
    for j in range(n):
        if tok[j] < 0 or tok[j] >= t_n:
            stats[1] = 1
            return
        if ex[j] < 0 or ex[j] >= n_expert:
            stats[1] = 2
            return
        cnt[ex[j]] += 1
    na = 0
    s = 0
    for e in range(n_expert):
        start[e] = s
        if cnt[e] > 0:
            active[na] = e
            na += 1
        s += cnt[e]
        cnt[e] = start[e]  # becomes the fill cursor, then the end of e's tasks
    for j in range(n):
        order[cnt[ex[j]]] = j
        cnt[ex[j]] += 1
    stats[0] = na
    gq, gd, gb, g8, gf = actg
    uq, ud, ub, u8, uf = actu
    hq, hd, hb, h8, hf = acth
    # ---- 1. quantize x once (for up too if its weights pair with another activation type)
    if par_quant and t_n >= min_tasks:
        for t in prange(t_n):
            quantize_row(x[t], ag, t, gq, gd, gb, g8, gf)
            if au != ag:
                quantize_row(x[t], au, t, uq, ud, ub, u8, uf)
    else:
        for t in range(t_n):
            quantize_row(x[t], ag, t, gq, gd, gb, g8, gf)
            if au != ag:
                quantize_row(x[t], au, t, uq, ud, ub, u8, uf)
    # ---- 2. gate, up, silu(gate) * up: items = (active expert, chunk of F rows)
    for tid in prange(nt):
        _gate_up_items(
            tid, nt, na, f, chunk, tok, order, start, cnt, active, gk, gw, actg, uk, uw, actu, h
        )
    # ---- 3. quantize the intermediate rows (one per task, in grouped order)
    if par_quant and n >= min_tasks:
        for p in prange(n):
            quantize_row(h[p], ad, p, hq, hd, hb, h8, hf)
    else:
        for p in range(n):
            quantize_row(h[p], ad, p, hq, hd, hb, h8, hf)
    # ---- 4. down and the weighted sum: items = chunks of D rows, all active experts
    for tid in prange(nt):
        _down_items(tid, nt, na, dim, chunk, tok, wt, order, start, cnt, active, dk, dw, acth, out)


_LITERAL_ARGS = (5, 7, 9)  # gk, uk, dk in _run_layer's arguments


class ExpertPool:
    """Runs one layer's CPU-side experts on `n_threads` Numba threads.

    run_layer(x [T, D] f32, tok [N] i32, expert [N] i32, weight [N] f32, gate, up, down) -> [T, D]

    gate/up/down are expert tensors [E, F, D] / [E, F, D] / [E, D, F]: a `LayerWeights` (from
    `prepare_layer`, passed as `gate`), three `ExpertMatrix`, or anything with
    `.qtype/.shape/.data` (prepared on first use and kept, by identity, until
    `clear_prepared()`: for repacked formats that is a RAM copy of the layer). The result is a
    view into a workspace, overwritten by the next call, unless `out` is given. One pool serves
    one calling thread at a time (the workspaces are shared).
    """

    def __init__(
        self,
        n_threads: int | None = None,
        parallel_quant: bool | None = None,
        quant_min_tasks: int | None = None,
        row_chunk: int = 32,
    ):
        limit = numba.config.NUMBA_NUM_THREADS
        n = limit if n_threads is None else int(n_threads)
        if n < 1:
            raise ValueError(f"n_threads must be >= 1, got {n}")
        if n > limit:
            print(f"strata: CPU pool capped at {limit} threads (NUMBA_NUM_THREADS), {n} asked")
            n = limit
        self.n_threads = n
        if parallel_quant is None:
            parallel_quant = _env_flag("STRATA_POOL_PARALLEL_QUANT", True)
        if quant_min_tasks is None:
            quant_min_tasks = int(os.environ.get("STRATA_POOL_QUANT_MIN_TASKS", "16"))
        self.parallel_quant = bool(parallel_quant)
        self.quant_min_tasks = int(quant_min_tasks)
        self.row_chunk = int(row_chunk)
        self._prepared: dict[int, tuple[object, ExpertMatrix]] = {}
        self._ws: dict[str, object] = {}
        self._stats = np.zeros(2, np.int64)
        self._entries: dict[tuple, object] = {}
        self.last_active_experts = 0
        self.last_bytes = 0  # bytes the kernels read in the last call
        self.last_gguf_bytes = 0  # the same experts in the GGUF encoding

    # ---- weights
    def clear_prepared(self) -> None:
        """Drop the layers prepared from raw tensors (their repacked copies)."""
        self._prepared.clear()

    def _matrix(self, t) -> ExpertMatrix:
        if isinstance(t, ExpertMatrix):
            return t
        hit = self._prepared.get(id(t))
        if hit is None or hit[0] is not t:
            hit = (t, prepare_tensor(t))
            self._prepared[id(t)] = hit
        return hit[1]

    # ---- workspaces
    def _workspace(self, t_n: int, n: int, dim: int, f: int, n_expert: int, acts) -> dict:
        ws = self._ws
        key = (dim, f, n_expert, acts)
        if ws.get("key") != key or ws["t_cap"] < t_n or ws["n_cap"] < n:
            t_cap = max(t_n, 2 * ws.get("t_cap", 0) if ws.get("key") == key else t_n, 1)
            n_cap = max(n, 2 * ws.get("n_cap", 0) if ws.get("key") == key else n, 1)
            ag, au, _ = acts
            actg = alloc_act(t_cap, dim)
            ws.update(
                key=key,
                t_cap=t_cap,
                n_cap=n_cap,
                actg=actg,
                actu=actg if au == ag else alloc_act(t_cap, dim),
                acth=alloc_act(n_cap, f),
                h=np.zeros((n_cap, f), np.float32),
                order=np.zeros(n_cap, np.int32),
                cnt=np.zeros(n_expert, np.int64),
                start=np.zeros(n_expert, np.int64),
                active=np.zeros(n_expert, np.int64),
                out=np.zeros((t_cap, dim), np.float32),
            )
        return ws

    def _entry(self, args, g, u, d):
        """The compiled specialization for these kernels, called without Numba's dispatch.

        `_run_layer` takes the kernel codes as literals; through the dispatcher every call
        would first try (and fail) to type a non-literal version, costing milliseconds.
        """
        key = (
            g.type_key,
            u.type_key,
            d.type_key,
            tuple(a.flags.writeable for a in args[:4]),
        )  # read-only inputs type differently
        fn = self._entries.get(key)
        if fn is None:
            fn = self._entries[key] = specialized(_run_layer, args, _LITERAL_ARGS)
        return fn

    # ---- the call
    def run_layer(self, x, tok, expert, weight, gate, up=None, down=None, out=None) -> np.ndarray:
        lw = (
            gate
            if isinstance(gate, LayerWeights)
            else LayerWeights(self._matrix(gate), self._matrix(up), self._matrix(down))
        )
        g, u, d = lw.gate, lw.up, lw.down
        x = np.ascontiguousarray(x, dtype=np.float32)
        tok = np.ascontiguousarray(tok, dtype=np.int32)
        expert = np.ascontiguousarray(expert, dtype=np.int32)
        weight = np.ascontiguousarray(weight, dtype=np.float32)
        t_n, dim = x.shape
        n = tok.shape[0]
        if dim != g.cols:
            raise ValueError(f"x has {dim} columns, the experts take {g.cols}")
        if expert.shape[0] != n or weight.shape[0] != n:
            raise ValueError(
                f"tok, expert, weight lengths differ: {n}, {expert.shape[0]}, {weight.shape[0]}"
            )
        ws = self._workspace(t_n, n, dim, g.rows, g.n_expert, (g.act, u.act, d.act))
        if out is None:
            out = ws["out"][:t_n]
        elif (
            out.shape != (t_n, dim)
            or out.dtype != np.float32
            or not out.flags.c_contiguous
            or not out.flags.writeable
            or out.ndim != 2
        ):
            raise ValueError(f"out must be a writable C-contiguous float32 array {(t_n, dim)}")
        args = (
            x,
            tok,
            expert,
            weight,
            g.data,
            g.kernel,
            u.data,
            u.kernel,
            d.data,
            d.kernel,
            g.n_expert,
            g.act,
            ws["actg"],
            u.act,
            ws["actu"],
            d.act,
            ws["acth"],
            ws["h"],
            ws["order"],
            ws["cnt"],
            ws["start"],
            ws["active"],
            out,
            self.n_threads,
            self.parallel_quant,
            self.quant_min_tasks,
            self.row_chunk,
            self._stats,
        )
        numba.set_num_threads(self.n_threads)
        self._entry(args, g, u, d)(*args)
        if self._stats[1] == ERR_TOKEN:
            raise ValueError(f"a token index is outside 0..{t_n - 1}")
        if self._stats[1] == ERR_EXPERT:
            raise ValueError(f"an expert id is outside 0..{g.n_expert - 1}")
        na = int(self._stats[0])
        self.last_active_experts = na
        self.last_bytes = na * lw.expert_nbytes
        self.last_gguf_bytes = na * lw.expert_gguf_bytes
        return out
