"""Split-K attention over the KV cache (kernels/attention.cu): launcher, workspace, reference.

The cache is f16 (uint16 bits) or int8 with a float32 scale per row (`k_scale`/`v_scale`
[G, S_cap], strata.gpu.rope_kv.quantize_kv_rows); the int8 form runs the `_i8` kernels, the
same code instantiated for int8 rows (a template argument, no branch in the loops).

Decode (T = 1) and causal prefill (T > 1) share the three launches; the scores of a call live in
a preallocated workspace [T*H, S_cap], so `AttnWorkspace.tmax` bounds the query rows per call
(the tier feeds longer prompts in chunks of that size).

`attention_mma` is causal prefill over an f16 cache on the f16 tensor cores (CUDA sm_80+,
kernels/attention_mma.cu): the same function and roundings in one launch, with no workspace.

`attention_decode` is the T = 1 form for CUDA graphs: it reads the position from device memory
and its launches depend only on S_cap and the workspace, so one capture serves every position.
"""

from __future__ import annotations

import numpy as np

from strata.cpu.kv import dequantize_kv_rows
from strata.gpu.rawmod import Kernels, f32, i32, ptr
from strata.gpu.rope_kv import kv_is_int8

TILE = 64  # ATT_TILE in attention.cu
MAX_REP = 16
MAX_DH = 128


class AttnWorkspace:
    """Scores [tmax*H, S_cap], tile partials and split partials, sized once."""

    def __init__(self, cp, K: Kernels, n_head: int, n_kv: int, s_cap: int, dv: int, tmax: int):
        self.h, self.s_cap, self.dv, self.tmax = n_head, s_cap, dv, tmax
        self.ntc = -(-s_cap // TILE)
        self.max_split = MAX_SPLIT
        self.scores = cp.empty((tmax * n_head, s_cap), np.float32)
        self.pmax = cp.empty((tmax * n_head, self.ntc), np.float32)
        self.psum = cp.empty((tmax * n_head, self.ntc), np.float32)
        cap = max(t * n_splits(K, s_cap, n_kv, t, MAX_SPLIT) for t in range(1, tmax + 1))
        self.opart = cp.empty((cap * n_head * dv,), np.float32)
        # attention_decode: the scores above (first H rows), and per split (max, sum) + output
        self.dec_nsplit = dec_splits(K, s_cap, n_kv)
        self.dec_pm = cp.empty((n_head, self.dec_nsplit), np.float32)
        self.dec_pl = cp.empty((n_head, self.dec_nsplit), np.float32)
        self.dec_opart = cp.empty((n_head, self.dec_nsplit, dv), np.float32)
        nteam = -(-self.dec_nsplit // DEC_TEAM_MIN)
        self.dec_tpart = cp.empty((n_head, nteam, dv), np.float32)
        # splits done per KV head, then per team of splits: each set back to 0 by its last block
        self.dec_cnt = cp.zeros((n_kv * (1 + nteam),), np.int32)
        self.dec_min_chunk = DEC_MIN_CHUNK
        # the decode grids (split counts) dec_grid_for picks from, the full one last; launches
        # use dec_nsplit, which a graph decoder sets per step (each grid its own graphs)
        full = self.dec_nsplit
        self.dec_grids = tuple(sorted({n for n in DEC_GRIDS if 0 < n < full})) + (full,)
        # positions whose keys (at most this many) the one-launch kernel takes (DEC_SHORT_GRID)
        self.dec_short = DEC_SHORT_KEYS

    @staticmethod
    def bytes_for(K: Kernels, n_head: int, n_kv: int, s_cap: int, dv: int, tmax: int) -> int:
        ntc = -(-s_cap // TILE)
        cap = max(t * n_splits(K, s_cap, n_kv, t, MAX_SPLIT) for t in range(1, tmax + 1))
        nsplit = dec_splits(K, s_cap, n_kv)
        nteam = -(-nsplit // DEC_TEAM_MIN)
        dec = n_head * nsplit * (2 + dv) + n_head * nteam * dv + n_kv * (1 + nteam)
        return 4 * (tmax * n_head * (s_cap + 2 * ntc) + cap * n_head * dv + dec)


MAX_SPLIT = 256


def n_splits(K: Kernels, s: int, g: int, t: int, max_split: int = MAX_SPLIT) -> int:
    """Key splits: enough blocks for four per SM, each split at least one tile."""
    want = -(-4 * K.sm_count // max(1, g * t))
    return int(max(1, min(max_split, -(-s // TILE), want)))


def attention(
    K: Kernels,
    ws: AttnWorkspace,
    q,
    k_cache,
    v_cache,
    t: int,
    pos0: int,
    dims: tuple[int, int, int, int],
    scale: float,
    out,
    k_scale=None,
    v_scale=None,
    window: int = 0,
    sinks=None,
) -> None:
    """out [T, H*Dv] = softmax(q k^T * scale, causal) v for q [T, H, Dh] (f16 values); an int8
    cache (k_cache/v_cache int8) comes with its scales k_scale/v_scale [G, S_cap]. window > 0:
    query t sees its last `window` positions only; sinks [H] float32 (device): a logit per head
    in the softmax's denominator only (gpt-oss)."""
    h, g, dh, dv = dims
    if h // g > MAX_REP or dh > MAX_DH or dv > MAX_DH or h % g or dh % 8 or dv % 8:
        raise ValueError(f"attention shape H={h} G={g} Dh={dh} Dv={dv} is not supported")
    i8 = kv_is_int8(k_cache, v_cache, k_scale, v_scale)
    sfx = "_i8" if i8 else ""
    s = pos0 + t
    s_cap = k_cache.shape[1]
    ntiles = -(-s // TILE)
    K.fn("attention.cu", "attn_scores" + sfx)(
        (ntiles, g, t),
        (TILE,),
        (
            q,
            k_cache,
            *((k_scale,) if i8 else ()),
            i32(s_cap),
            i32(dh),
            i32(h),
            i32(g),
            i32(pos0),
            i32(s),
            f32(scale),
            ws.scores,
            i32(ws.s_cap),
            ws.pmax,
            ws.psum,
            i32(ws.ntc),
            i32(window),
        ),
    )
    nsplit = n_splits(K, s, g, t, ws.max_split)
    chunk = -(-s // nsplit)
    threads = -(-dv // K.warp) * K.warp
    K.fn("attention.cu", "attn_pv" + sfx)(
        (nsplit, g, t),
        (threads,),
        (
            ws.scores,
            i32(ws.s_cap),
            ws.pmax,
            ws.psum,
            i32(ws.ntc),
            i32(ntiles),
            v_cache,
            *((v_scale,) if i8 else ()),
            i32(s_cap),
            i32(dv),
            i32(h),
            i32(g),
            i32(s),
            i32(chunk),
            ws.opart,
            i32(nsplit),
            ptr(sinks),
        ),
    )
    K.fn("attention.cu", "attn_combine")(
        (t * h,), (threads,), (ws.opart, i32(nsplit), i32(dv), out)
    )


MMA_ROWS = 64  # attention_mma.cu's AMMA_ROWS: query rows per block
MMA_THREADS = 128  # AMMA_THREADS: 4 warps of 16 rows


def attention_mma_shape_ok(dims: tuple[int, int, int, int]) -> bool:
    """Whether attention_mma takes heads (H, G, Dh, Dv): G divides H, Dh and Dv multiples of 16
    up to MAX_DH."""
    h, g, dh, dv = dims
    return h % g == 0 and all(0 < d <= MAX_DH and d % 16 == 0 for d in (dh, dv))


def attention_mma(
    K: Kernels,
    q,
    k_cache,
    v_cache,
    t: int,
    pos0: int,
    dims: tuple[int, int, int, int],
    scale: float,
    out,
) -> None:
    """`attention` for an f16 cache on the f16 tensor cores (K.int8_mma devices: CUDA sm_80+):
    out [T, H*Dv] = softmax(q k^T * scale, causal) v for q [T, H, Dh] (f16 values), in one
    launch of (ceil(T / 64), H) blocks, any T (no scores workspace). Same roundings: scores in
    float32, probabilities rounded to f16 after normalizing, float32 sums (their order differs:
    float noise). Dh, Dv multiples of 16 up to 128; other shapes and an int8 cache raise
    ValueError (the caller keeps `attention`)."""
    h, g, dh, dv = dims
    if not attention_mma_shape_ok(dims):
        raise ValueError(f"attention_mma shape H={h} G={g} Dh={dh} Dv={dv} is not supported")
    if k_cache.dtype != np.uint16 or v_cache.dtype != np.uint16:
        raise ValueError("attention_mma takes an f16 cache (uint16 bits) only")
    if not K.int8_mma:  # elsewhere the kernel is compiled empty
        raise ValueError(f"attention_mma needs the tensor-core mma (CUDA sm_80+), not {K.arch!r}")
    K.fn("attention_mma.cu", "attn_prefill_mma")(
        (-(-t // MMA_ROWS), h),
        (MMA_THREADS,),
        (
            q, k_cache, v_cache, i32(k_cache.shape[1]), i32(dh), i32(dv), i32(h), i32(g),
            i32(t), i32(pos0), f32(scale), out,
        ),
    )  # fmt: skip


DEC_THREADS = 128  # attention.cu's DEC_THREADS
DEC_MIN_CHUNK = 64  # keys a split takes at least (a multiple of 32: fewer splits to combine)
DEC_BLOCKS_PER_SM = 4  # at long contexts: nsplit * G blocks, this many per SM
# The split counts of the smaller decode grids (`dec_grid_for`) the graph decoder captures for
# short positions. A grid's blocks past the live splits only read the position and leave, yet
# cost: at 4096 keys the same 64 live splits took 19.1 us on 66 blocks a KV head and 22.0 on 132.
DEC_GRIDS = (8, 32)
# attention.cu's DEC_TEAM (splits summed together first) is at least this:
# the decode workspace holds the team partials and counters of teams this small
DEC_TEAM_MIN = 8
# The one-launch decode kernel (attn_dec_short: a block per query head over every key) for
# positions of at most DEC_SHORT_KEYS keys; a workspace's dec_nsplit of DEC_SHORT_GRID launches
# it. DEC_SHORT_MAX: attention.cu's (the keys its shared memory holds). H200, Qwen3-30B-A3B heads,
# graph + PDL: 5.6 / 10.3 / 13.4 / 16.5 us at 64 / 512 / 768 / 1024 keys against the best split
# grid's 12.0 / 12.9 / 16.0 / 16.5 (past 1024 the splits win).
DEC_SHORT_MAX = 2048
DEC_SHORT_GRID = 0
DEC_SHORT_KEYS = 768
DS_THREADS = 512  # attention.cu's DS_THREADS


def dec_splits(K: Kernels, s_cap: int, g: int, per_sm: int = DEC_BLOCKS_PER_SM) -> int:
    """attention_decode's fixed split count: `per_sm` blocks per SM over the G KV heads."""
    want = -(-per_sm * K.sm_count // max(1, g))
    return int(max(1, min(-(-s_cap // 32), want)))


def dec_grid_for(ws: AttnWorkspace, pos: int) -> int:
    """DEC_SHORT_GRID (the one-launch kernel) for a position of at most ws.dec_short keys,
    else the smallest of
    ws.dec_grids that splits keys 0..pos as the full grid does: dec_split
    (attention.cu) cuts S keys into min(nsplit, ceil(S / min_chunk)) splits, so every grid of
    n >= ceil(S / min_chunk) splits gives the same chunks, the same sums in the same order:
    the same bits, from fewer blocks."""
    if pos + 1 <= ws.dec_short:
        return DEC_SHORT_GRID
    need = -(-(pos + 1) // ws.dec_min_chunk)
    for n in ws.dec_grids:
        if n >= need:
            return n
    return ws.dec_grids[-1]


def rep_bucket(rep: int) -> int:
    """H/G rounded up to a power of two: the template argument of the decode kernels."""
    r = 1
    while r < rep:
        r *= 2
    return r


def attention_decode(
    K: Kernels,
    ws: AttnWorkspace,
    q,
    k_cache,
    v_cache,
    pos_dev,
    dims: tuple[int, int, int, int],
    scale: float,
    out,
    k_scale=None,
    v_scale=None,
    window: int = 0,
    sinks=None,
) -> None:
    """out [1, H*Dv] = softmax(q k^T * scale) v over keys 0..pos (a sliding layer's: its last
    `window`; sinks as `attention`) for q [1, H, Dh] (f16 values),
    pos = pos_dev[0] read on the device (its K/V row already appended). Launches whose
    grids and arguments depend only on S_cap and `ws`: capturable once, replayable at any pos.
    Roundings as `attention` (probabilities rounded to f16 after normalizing); deterministic.
    An int8 cache comes with k_scale/v_scale [G, S_cap].

    Under programmatic dependent launch (a graph captured in `Kernels.pdl_scope`) both kernels
    read pos_dev *before* waiting on the kernel ahead of them (to ask L2 for their split's rows
    early: attention.cu dec_enter), so pos_dev must be written before the launch ahead of this
    call's first one: the graph decoder uploads it at the step's start."""
    h, g, dh, dv = dims
    if h // g > MAX_REP or dh > MAX_DH or dv > MAX_DH or h % g or dh % 8 or dv % 8:
        raise ValueError(f"attention shape H={h} G={g} Dh={dh} Dv={dv} is not supported")
    s_cap = k_cache.shape[1]
    if (
        s_cap > ws.s_cap
        or h != ws.h
        or dv > ws.dv
        or g * (1 + ws.dec_tpart.shape[1]) > ws.dec_cnt.size
    ):
        raise ValueError(
            f"decode workspace (H={ws.h}, S_cap={ws.s_cap}, Dv={ws.dv}) does not fit "
            f"H={h}, S_cap={s_cap}, Dv={dv}"
        )
    if pos_dev.dtype != np.int32 or pos_dev.size < 1:
        raise ValueError("pos_dev must be a device int32 array holding the position")
    for fn, grid, block, args in decode_launches(
        K, ws, q, k_cache, v_cache, pos_dev, dims, scale, out, k_scale, v_scale, window, sinks
    ):
        fn(grid, block, args)


def decode_launches(
    K: Kernels,
    ws: AttnWorkspace,
    q,
    k_cache,
    v_cache,
    pos_dev,
    dims,
    scale,
    out,
    k_scale=None,
    v_scale=None,
    window: int = 0,
    sinks=None,
):
    """attention_decode's launches as (kernel, grid, block, args), for benchmarks to time one by
    one: two (scores, then p.V and the splits' sum), or with ws.dec_nsplit == DEC_SHORT_GRID the
    one of attn_dec_short (keys 0..pos, pos + 1 <= DEC_SHORT_MAX: the caller's to ensure, as
    dec_grid_for does)."""
    h, g, dh, dv = dims
    s_cap = k_cache.shape[1]
    r = rep_bucket(h // g)
    nsplit = ws.dec_nsplit
    i8 = kv_is_int8(k_cache, v_cache, k_scale, v_scale)
    sfx = "_i8" if i8 else ""
    ks, vs = ((k_scale,), (v_scale,)) if i8 else ((), ())
    if nsplit == DEC_SHORT_GRID:
        short = K.fn("attention.cu", f"attn_dec_short{sfx}")
        return [
            (
                short,
                (h,),
                (DS_THREADS,),
                (
                    q, k_cache, *ks, v_cache, *vs, pos_dev, i32(s_cap), i32(dh), i32(dv), i32(h),
                    i32(g), f32(scale), out, i32(window), ptr(sinks),
                ),
            )
        ]  # fmt: skip
    scores = K.fn("attention.cu", f"attn_dec_scores{sfx}_r{r}")
    pv = K.fn("attention.cu", f"attn_dec_pv{sfx}_r{r}")
    return [
        (
            scores,
            (nsplit, g),
            (DEC_THREADS,),
            (
                q, k_cache, *ks, pos_dev, i32(s_cap), i32(dh), i32(h), i32(g), f32(scale),
                ws.scores, i32(ws.s_cap), ws.dec_pm, ws.dec_pl, i32(nsplit),
                i32(ws.dec_min_chunk), i32(window),
            ),
        ),
        (
            pv,
            (nsplit, g),
            (DEC_THREADS,),
            (
                ws.scores, i32(ws.s_cap), ws.dec_pm, ws.dec_pl, v_cache, *vs, pos_dev,
                i32(s_cap), i32(dv), i32(h), i32(g), ws.dec_opart, i32(nsplit),
                i32(ws.dec_min_chunk), ws.dec_cnt, ws.dec_tpart, out, i32(window), ptr(sinks),
            ),
        ),
    ]  # fmt: skip


def attention_ref(q, k, v, pos0: int, scale: float, window: int = 0, sinks=None) -> np.ndarray:
    """HostTier's attention core. q [T, H, Dh] (f16 values), k [S, G, Dh] f16, v [S, G, Dv] f16
    (or the float32 rows an int8 cache reads back as: `attention_int8_ref`) with S = pos0 + T
    -> o [T, H*Dv]; window and sinks [H] (NumPy) as `attention`."""
    t, h, dh = q.shape
    s, g, dv = v.shape
    rep = h // g
    kc, vc = k.astype(np.float32), v.astype(np.float32)
    qg = q.astype(np.float32).reshape(t, g, rep, dh)
    scores = np.einsum("tgrd,sgd->grts", qg, kc) * np.float32(scale)
    kp, qp = np.arange(s)[None, :], (pos0 + np.arange(t))[:, None]
    mask = (kp > qp) | ((qp - kp >= window) if window else False)
    scores[..., mask] = -np.inf
    m = scores.max(axis=-1, keepdims=True)
    sk = None if sinks is None else np.asarray(sinks, np.float32).reshape(g, rep, 1, 1)
    if sk is not None:
        m = np.maximum(m, sk)
    p = np.exp(scores - m)
    total = p.sum(axis=-1, keepdims=True)
    if sk is not None:
        total += np.exp(sk - m)
    p /= total
    p = p.astype(np.float16).astype(np.float32)
    return np.einsum("grts,sgd->tgrd", p, vc).reshape(t, h * dv)


def attention_int8_ref(q, k8, kd, v8, vd, pos0: int, scale: float) -> np.ndarray:
    """HostTier's attention core over an int8 cache: k8 [S, G, Dh] int8 with kd [S, G] float32,
    v8 [S, G, Dv] with vd [S, G], read back as q * d (float32) -> o [T, H*Dv]."""
    return attention_ref(q, dequantize_kv_rows(k8, kd), dequantize_kv_rows(v8, vd), pos0, scale)
