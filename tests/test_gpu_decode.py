"""Decode kernels for CUDA graphs: attention and RoPE/KV append with the position read from device
memory, and the T = 1 GEMV with rows split over warps (gemv1w_*).

attention_decode is held to HostTier's attention core (`attention_ref`) with test_gpu_kernels'
bound (1e-5 of the output's scale, plus one f16 step where a probability sits at a rounding
midpoint), at key counts around the split and tile edges and next to the cache's end, for every
head-group shape the kernels template on; a launch captured once in a CUDA graph and replayed at
other positions must give those positions' answers. qk_norm_rope_kv's device-position form must
equal its argument form bit for bit. gemv1w_* is checked against the NumPy reference of the
quantized dot product and against gemv1_* (the same per-sub-block arithmetic) at 1 and 2 warps
per row, with a column count that splits unevenly over the warps.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType

cp = pytest.importorskip("cupy")

from strata.cpu.tier import rope_inv_freq  # noqa: E402
from strata.gpu.attention import (  # noqa: E402
    DEC_SHORT_GRID,
    DEC_SHORT_MAX,
    AttnWorkspace,
    attention_decode,
    attention_ref,
    dec_grid_for,
    dec_splits,
)
from strata.gpu.gemv import (  # noqa: E402
    WARPS_PER_SM,
    DeviceWeight,
    gemv,
    gemv_ref,
    warps_per_row,
)
from strata.gpu.norm_quant import ActBuf, norm_quant  # noqa: E402
from strata.gpu.rope_kv import qk_norm_rope_kv  # noqa: E402
from strata.quant import random_quantized  # noqa: E402
from tests.test_gpu_kernels import flip_allowance, rel  # noqa: E402

QT = GGMLQuantizationType
pytestmark = pytest.mark.gpu
S_CAP = 4352


class Case:
    """Random q and a KV cache [G, S_CAP, Dh] whose first `s_max` rows are filled."""

    def __init__(self, g: np.random.Generator, gk: int, rep: int, dh: int, s_max: int):
        self.h, self.gk, self.dh = gk * rep, gk, dh
        self.q = g.standard_normal((1, self.h, dh)).astype(np.float16).astype(np.float32)
        # a spread of score scales: some heads nearly uniform, some peaked
        self.q *= np.float32(2.0) ** g.integers(-2, 3, (1, self.h, 1)).astype(np.float32)
        self.k = g.standard_normal((s_max, gk, dh)).astype(np.float16)
        self.v = g.standard_normal((s_max, gk, dh)).astype(np.float16)
        kc = np.zeros((gk, S_CAP, dh), np.float16)
        vc = np.zeros((gk, S_CAP, dh), np.float16)
        kc[:, :s_max] = self.k.transpose(1, 0, 2)
        vc[:, :s_max] = self.v.transpose(1, 0, 2)
        self.kc, self.vc = cp.asarray(kc.view(np.uint16)), cp.asarray(vc.view(np.uint16))
        self.scale = float(np.float32(1.0 / np.sqrt(dh)))
        self.dims = (self.h, gk, dh, dh)

    def check(self, out, s: int) -> None:
        """out [1, H*Dh] against the reference over keys 0..s-1 (position s - 1)."""
        q, k, v = self.q, self.k[:s], self.v[:s]
        want = attention_ref(q, k, v, s - 1, self.scale)
        err = np.abs(cp.asnumpy(out)[:1] - want)
        bound = 1e-5 * np.abs(want).max() + flip_allowance(q, k, v, s - 1, self.scale)
        assert np.all(err <= bound), f"S={s}: max excess {float((err - bound).max()):.3g}"


SIZES = [1, 63, 64, 65, 4096 + 17, S_CAP - 3, S_CAP]
SHAPES = [  # (G, H/G, Dh): rep 1/4/8 as asked, 6 (not a power of two) and 16 (the largest)
    (2, 1, 128),
    (4, 4, 64),
    (4, 8, 128),
    (2, 8, 64),
    (4, 1, 64),
    (2, 4, 128),
    (4, 6, 128),
    (2, 16, 64),
]


SHORT_SIZES = [1, 2, 31, 63, 64, 65, 255, 513, 1024, DEC_SHORT_MAX - 1, DEC_SHORT_MAX]


@pytest.mark.parametrize("kernel", ["splits", "short"])
@pytest.mark.parametrize("gk,rep,dh", SHAPES, ids=lambda v: str(v))
def test_attention_decode_matches_reference(K, gk, rep, dh, kernel):
    """The split kernels (the workspace's full grid), attn_dec_short (one launch, a block per
    query head: key counts around its lane and row steps, up to the most it holds)."""
    g = np.random.default_rng()
    c = Case(g, gk, rep, dh, S_CAP)
    ws = AttnWorkspace(cp, K, c.h, gk, S_CAP, dh, 1)
    if kernel == "short":
        ws.dec_nsplit = DEC_SHORT_GRID
    out = cp.full((1, c.h * dh), np.nan, np.float32)
    pos = cp.zeros(1, np.int32)
    for s in SHORT_SIZES if kernel == "short" else SIZES:
        pos[...] = s - 1
        attention_decode(K, ws, cp.asarray(c.q), c.kc, c.vc, pos, c.dims, c.scale, out)
        c.check(out, s)


def test_attention_decode_is_deterministic(K):
    g = np.random.default_rng()
    c = Case(g, 4, 8, 128, S_CAP)
    ws = AttnWorkspace(cp, K, c.h, 4, S_CAP, 128, 1)
    q, pos = cp.asarray(c.q), cp.asarray(np.array([4000], np.int32))
    outs = []
    for _ in range(3):
        out = cp.empty((1, c.h * 128), np.float32)
        attention_decode(K, ws, q, c.kc, c.vc, pos, c.dims, c.scale, out)
        outs.append(cp.asnumpy(out))
    assert all(np.array_equal(outs[0].view(np.uint32), o.view(np.uint32)) for o in outs[1:])


def test_attention_decode_launch_does_not_depend_on_the_position(K):
    """One capture, replayed at positions on both sides of the split and tile edges."""
    g = np.random.default_rng()
    c = Case(g, 4, 8, 128, S_CAP)
    ws = AttnWorkspace(cp, K, c.h, 4, S_CAP, 128, 1)
    assert ws.dec_nsplit == dec_splits(K, S_CAP, 4)
    q = cp.asarray(c.q)
    out = cp.empty((1, c.h * 128), np.float32)
    pos = cp.zeros(1, np.int32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        attention_decode(K, ws, q, c.kc, c.vc, pos, c.dims, c.scale, out)  # compile first
        stream.synchronize()
        stream.begin_capture()
        attention_decode(K, ws, q, c.kc, c.vc, pos, c.dims, c.scale, out)
        graph = stream.end_capture()
        for s in (4096 + 17, 65, 1, S_CAP, 700):
            pos.set(np.array([s - 1], np.int32), stream=stream)
            out.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            c.check(out, s)


@pytest.mark.parametrize("gk,rep,dh", [(4, 8, 128), (2, 16, 64), (4, 6, 128)], ids=str)
def test_attention_decode_smaller_grids_give_the_full_grids_bits(K, gk, rep, dh):
    """Every grid dec_grid_for may pick for a position gives the full grid's output bit for bit
    (the graph decoder captures one graph per grid), in a grid replayed at several positions."""
    g = np.random.default_rng()
    c = Case(g, gk, rep, dh, S_CAP)
    ws = AttnWorkspace(cp, K, c.h, gk, S_CAP, dh, 1)
    ws.dec_short = 0  # the split grids alone (the one-launch kernel's sums are its own)
    full = ws.dec_nsplit
    q = cp.asarray(c.q)
    pos = cp.zeros(1, np.int32)
    mc = ws.dec_min_chunk
    picked = set()
    for s in (1, 31, mc, mc + 1, 8 * mc - 1, 8 * mc, 8 * mc + 1, 32 * mc, 32 * mc + 5, S_CAP):
        pos[...] = s - 1
        ws.dec_nsplit = full
        want = cp.full((1, c.h * dh), np.nan, np.float32)
        attention_decode(K, ws, q, c.kc, c.vc, pos, c.dims, c.scale, want)
        c.check(want, s)
        n = dec_grid_for(ws, s - 1)
        picked.add(n)
        assert n in ws.dec_grids and (n == full or n * mc >= s)
        for m in ws.dec_grids:
            if m * mc < s and m != full:
                continue  # a grid too small for s: never picked
            ws.dec_nsplit = m
            out = cp.full((1, c.h * dh), np.nan, np.float32)
            attention_decode(K, ws, q, c.kc, c.vc, pos, c.dims, c.scale, out)
            np.testing.assert_array_equal(
                cp.asnumpy(out).view(np.uint32),
                cp.asnumpy(want).view(np.uint32),
                err_msg=f"{s} {m}",
            )
    assert len(picked) == len(ws.dec_grids)  # every grid was picked by some position


def test_attention_decode_one_launch_kernel_is_deterministic_and_replays_in_a_graph(K):
    """attn_dec_short: repeated calls give the same bits; one capture (with PDL where the card
    has it, as the graph decoder captures) replays at other positions."""
    c = Case(np.random.default_rng(), 4, 8, 128, S_CAP)
    ws = AttnWorkspace(cp, K, c.h, 4, S_CAP, 128, 1)
    ws.dec_nsplit = DEC_SHORT_GRID
    s0, sizes = 1500, (700, 65, 1, DEC_SHORT_MAX, 1024)
    q, out = cp.asarray(c.q), cp.empty((1, c.h * 128), np.float32)
    pos = cp.asarray(np.array([s0], np.int32))
    outs = []
    for _ in range(3):
        attention_decode(K, ws, q, c.kc, c.vc, pos, c.dims, c.scale, out)
        outs.append(cp.asnumpy(out).view(np.uint32))
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        with K.pdl_scope():
            attention_decode(K, ws, q, c.kc, c.vc, pos, c.dims, c.scale, out)
        graph = stream.end_capture()
        for s in (s0 + 1, *sizes):
            pos.set(np.array([s - 1], np.int32), stream=stream)
            out.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            c.check(out, s)
            if s == s0 + 1:  # the eager calls' position: the replay gives their bits
                np.testing.assert_array_equal(cp.asnumpy(out).view(np.uint32), outs[0])


def test_attention_decode_refuses_a_small_workspace(K):
    c = Case(np.random.default_rng(), 2, 4, 64, 8)
    ws = AttnWorkspace(cp, K, c.h, 2, 1024, 64, 1)  # S_cap 1024 < the cache's 4352
    with pytest.raises(ValueError, match="workspace"):
        attention_decode(
            K, ws, cp.asarray(c.q), c.kc, c.vc, cp.zeros(1, np.int32), c.dims, c.scale,
            cp.empty((1, c.h * 64), np.float32),
        )  # fmt: skip


# ---- q/k norm + RoPE + KV append: the position from device memory ----
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("t,pos0", [(1, 0), (1, 4095), (3, 1000)])
def test_rope_kv_device_position_is_bit_identical(K, qk_norm, t, pos0):
    g = np.random.default_rng()
    h, gk, dh, dv, s_cap = 8, 2, 128, 128, 4096 + 8
    qkv = cp.asarray(g.standard_normal((t, (h + gk) * dh + gk * dv)).astype(np.float32))
    qn = cp.asarray((1 + 0.1 * g.standard_normal(dh)).astype(np.float32)) if qk_norm else None
    kn = cp.asarray((1 + 0.1 * g.standard_normal(dh)).astype(np.float32)) if qk_norm else None
    inv = cp.asarray(rope_inv_freq(dh, 1e6))

    def run(pos_dev, pos_arg):
        q = cp.empty((t, h, dh), np.float32)
        kc = cp.zeros((gk, s_cap, dh), np.uint16)
        vc = cp.zeros((gk, s_cap, dv), np.uint16)
        qk_norm_rope_kv(K, qkv, t, (h, gk, dh, dv), qn, kn, 1e-6, inv, pos_arg, q, kc, vc,
                        pos_dev=pos_dev)  # fmt: skip
        return cp.asnumpy(q).view(np.uint32), cp.asnumpy(kc), cp.asnumpy(vc)

    want = run(None, pos0)
    got = run(cp.asarray(np.array([pos0], np.int32)), 12345)  # pos0 argument ignored
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert want[1][:, pos0 : pos0 + t].any()  # the rows landed where the position says


def test_rope_kv_device_position_replays_in_a_graph(K):
    g = np.random.default_rng()
    h, gk, dh, s_cap = 4, 2, 64, 512
    qkv = cp.asarray(g.standard_normal((1, (h + 2 * gk) * dh)).astype(np.float32))
    inv = cp.asarray(rope_inv_freq(dh, 1e4))
    q, qw = cp.empty((1, h, dh), np.float32), cp.empty((1, h, dh), np.float32)
    kc, vc = cp.zeros((gk, s_cap, dh), np.uint16), cp.zeros((gk, s_cap, dh), np.uint16)
    kw, vw = cp.zeros_like(kc), cp.zeros_like(vc)
    pos = cp.zeros(1, np.int32)
    args = (K, qkv, 1, (h, gk, dh, dh), None, None, 1e-6, inv)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        qk_norm_rope_kv(*args, 0, q, kc, vc, pos_dev=pos)  # compile first; row 0 both sides
        qk_norm_rope_kv(*args, 0, qw, kw, vw)
        stream.synchronize()
        stream.begin_capture()
        qk_norm_rope_kv(*args, 0, q, kc, vc, pos_dev=pos)
        graph = stream.end_capture()
        for p in (7, 300):
            pos.set(np.array([p], np.int32), stream=stream)
            graph.launch(stream)
            qk_norm_rope_kv(*args, p, qw, kw, vw)
            stream.synchronize()
            np.testing.assert_array_equal(cp.asnumpy(q), cp.asnumpy(qw))
    np.testing.assert_array_equal(cp.asnumpy(kc), cp.asnumpy(kw))  # rows 0, 7 and 300
    np.testing.assert_array_equal(cp.asnumpy(vc), cp.asnumpy(vw))


# ---- staged decode GEMV ----
GEMV_QUANTS = [
    QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.IQ3_XXS, QT.IQ3_S, QT.IQ2_XXS, QT.IQ2_S,
    QT.IQ1_M, QT.MXFP4,
]  # fmt: skip


@pytest.mark.parametrize("qt", GEMV_QUANTS, ids=lambda q: q.name)
def test_gemv1w_matches_reference(K, qt):
    g = np.random.default_rng()
    # rows and columns that give 1 and 2 warps per row on this device (the second warp of a
    # 1792-column row gets 24 of the 56 sub-blocks)
    n = WARPS_PER_SM * K.sm_count
    shapes = [(n // 2 - 5, 1792), (n + 3, 512)]
    seen = set()
    for rows, cols in shapes:
        raw = random_quantized(qt, (rows, cols), g, 1 / np.sqrt(cols))
        bias = g.standard_normal(rows).astype(np.float32)
        resid = g.standard_normal((1, rows)).astype(np.float32)
        x = g.standard_normal((1, cols)).astype(np.float32)
        w = DeviceWeight(cp, raw, qt, rows, cols, bias=bias)
        seen.add(warps_per_row(K, w))
        act = ActBuf(cp, cols, 1, w.vec_dot)
        norm_quant(K, cp.asarray(x), 1, act=act)
        out = cp.empty((1, rows), np.float32)
        gemv(K, w, act, out, 1, resid=cp.asarray(resid))
        want = gemv_ref(raw, qt, x, bias, resid)
        assert rel(cp.asnumpy(out), want) < 1e-5, (rows, cols)
    assert seen == {1, 2}


@pytest.mark.parametrize("qt", [QT.Q8_0, QT.Q4_K, QT.IQ3_XXS, QT.IQ1_M], ids=lambda q: q.name)
def test_gemv1w_warps_and_pdl_trigger_leave_the_bits(K, qt, monkeypatch):
    """gemv1w_*'s warps a block (blockDim) and its PDL trigger (at once or after the loop)
    change where its blocks run, never a row's sums: chained launches, PDL where the device has
    it, each output bit-identical to the default's."""
    import strata.gpu.gemv as gm

    g = np.random.default_rng()
    rows, cols = 2 * WARPS_PER_SM * K.sm_count + 7, 1024
    raw = random_quantized(qt, (rows, cols), g, 1 / np.sqrt(cols))
    w = DeviceWeight(cp, raw, qt, rows, cols)
    act = ActBuf(cp, cols, 1, w.vec_dot)
    norm_quant(K, cp.asarray(g.standard_normal((1, cols)).astype(np.float32)), 1, act=act)
    resid = cp.asarray(g.standard_normal((1, rows)).astype(np.float32))
    want = cp.empty((1, rows), np.float32)
    gemv(K, w, act, want, 1)
    for warps in (2, 4, 16):
        for early_warps in (0, 1 << 30):
            monkeypatch.setattr(gm, "GEMV1_WARPS", warps)
            monkeypatch.setattr(gm, "GEMV1_WARPS_BY_TYPE", {})
            monkeypatch.setattr(gm, "PDL_EARLY_WARPS", early_warps)
            out = cp.full((3, rows), np.nan, np.float32)
            with K.pdl_scope():  # a chain: the second adds the row the first wrote
                gemv(K, w, act, out[0], 1)
                gemv(K, w, act, out[1], 1, resid=out[0:1])
                gemv(K, w, act, out[2], 1, resid=resid)
            got, w1 = cp.asnumpy(out), cp.asnumpy(want)[0]
            np.testing.assert_array_equal(got[0], w1)
            np.testing.assert_array_equal(got[1], 2 * w1)  # w1 + w1: exact
            np.testing.assert_array_equal(got[2], cp.asnumpy(want + resid)[0])
