"""Every device kernel against its NumPy reference, on fresh random inputs, for every format.

Skipped cleanly where CuPy or a device is missing. Comparisons: the activation quantization and
the embedding gather are bit-exact (same float32 operations); dot products differ from NumPy's
only by summation order (relative error < 1e-5 of the output's scale); attention and the RoPE
angles may differ by a few float32 ulps (libm vs device cosf/expf), and attention's f16-rounded
probabilities may flip by one f16 step where they sit within noise of a rounding midpoint.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType

cp = pytest.importorskip("cupy")

from gguf.quants import dequantize  # noqa: E402

from strata.cpu.tier import rope_inv_freq  # noqa: E402
from strata.gpu.attention import AttnWorkspace, attention, attention_ref  # noqa: E402
from strata.gpu.elementwise import (  # noqa: E402
    argmax_rows,
    f16_convert,
    silu_mul,
    silu_mul_ref,
)
from strata.gpu.embed import embed, embed_ref  # noqa: E402
from strata.gpu.experts import SlotStore, expert_ref, moe_experts  # noqa: E402
from strata.gpu.gemv import DeviceWeight, gemv, gemv_ref  # noqa: E402
from strata.gpu.norm_quant import (  # noqa: E402
    BLOCK,
    ActBuf,
    norm_quant,
    quant_ref,
    rms_norm_ref,
)
from strata.gpu.rawmod import Kernels  # noqa: E402
from strata.gpu.rope_kv import qk_norm_rope_kv, qk_norm_rope_kv_ref  # noqa: E402
from strata.gpu.router_topk import router_topk  # noqa: E402
from strata.quant import fmt, random_quantized  # noqa: E402
from strata.quant.activation import roundtrip  # noqa: E402
from strata.routing import route_topk  # noqa: E402

QT = GGMLQuantizationType
pytestmark = pytest.mark.gpu

QUANTS = [
    QT.Q8_0,
    QT.Q4_K,
    QT.Q5_K,
    QT.Q6_K,
    QT.IQ4_XS,
    QT.IQ3_XXS,
    QT.IQ3_S,
    QT.IQ2_XXS,
    QT.IQ2_S,
    QT.IQ1_M,
    QT.MXFP4,
]
FLOATS = [QT.F32, QT.F16, QT.BF16]


def rng() -> np.random.Generator:
    return np.random.default_rng()


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


def act_input(g, t, n):
    """Activations with a few outliers and an exact tie for the Q8_K max rule."""
    x = g.standard_normal((t, n)).astype(np.float32) * np.float32(g.uniform(0.1, 3))
    x[0, 5] = 9.0
    x[0, 7] = -9.0  # equal |max| in one block: the first one (positive) sets the sign
    if t > 1:
        x[1, : min(n, 256)] = 0  # an all-zero block: d = 0, q = 0
    return x


# ---- norm_quant ----
NQ_MODES = [QT.Q8_K, QT.Q8_0, QT.F16, QT.BF16, QT.F32]
NQ_TIES = ((0, (5, 7, 200), (1, -1, -1)), (0, (296, 297, 506), (-1, 1, 1)), (2, (31, 32), (-1, 1)))


def nq_input(g, t, n, with_norm):
    """Rows x [t, n] and norm weight w [n] (or None) with exact ties of the largest |y| inside a
    block (same lane, across lanes, either sign first), an all-zero Q8_K block (row 1) and an
    all-zero Q8_0 block (row 3): the tied columns share one w so the ties survive the norm."""
    x = g.standard_normal((t, n)).astype(np.float32) * np.float32(g.uniform(0.1, 3))
    w = (1 + 0.1 * g.standard_normal(n)).astype(np.float32) if with_norm else None
    m = np.float32(2 * np.abs(x).max())
    for row, cols, signs in NQ_TIES:
        if row < t and max(cols) < n:
            x[row, list(cols)] = m * np.float32(signs)
            if w is not None:
                w[list(cols)] = np.float32(1.25)
    if t > 1:
        x[1, : min(n, 256)] = 0
    if t > 3:
        x[3, 32 : min(n, 64)] = 0
    return x, w


def check_norm_quant(K, mode, x, w, t, xd=None):
    """Run norm_quant on rows 0..t-1 of x (device copy xd if given) and compare with NumPy."""
    n, eps = x.shape[-1], 1e-6
    act = ActBuf(cp, n, t + 2, mode)
    out_f = cp.empty((t + 2, n), np.float32)
    xd = cp.asarray(x) if xd is None else xd
    norm_quant(K, xd, t, None if w is None else cp.asarray(w), eps, out_f, act)
    y_ref = rms_norm_ref(x[:t], w, eps)
    y = cp.asnumpy(out_f)[:t]
    if w is not None:  # the f64 sum's order is the device's: the scale may differ in one ulp
        np.testing.assert_allclose(y, y_ref, rtol=2e-7, atol=0)
    else:
        np.testing.assert_array_equal(y, x[:t])
    ref = quant_ref(y, mode)  # quantize what the device normalized: must be bit-exact
    if "q" in ref:
        nb = ref["d"].shape[-1]
        np.testing.assert_array_equal(cp.asnumpy(act.q)[:t], ref["q"])
        d = cp.asnumpy(act.d).ravel()[: t * nb].reshape(t, nb)
        np.testing.assert_array_equal(d, ref["d"])
    else:
        np.testing.assert_array_equal(cp.asnumpy(act.r)[:t], ref["r"])


@pytest.mark.parametrize("n", [768, 2048, 4096])  # a decode layer's rows (Qwen3-30B-A3B)
@pytest.mark.parametrize("mode", NQ_MODES)
@pytest.mark.parametrize("with_norm", [False, True])
def test_norm_quant_matches_reference(K, mode, with_norm, n):
    g = rng()
    t = 5
    x, w = nq_input(g, t, n, with_norm)
    check_norm_quant(K, mode, x, w, t)


@pytest.mark.parametrize("n", [8448, 20480])  # 2 and 4 (one empty) chunks of 8 a thread
@pytest.mark.parametrize("mode", [QT.Q8_K, QT.Q8_0, QT.BF16])
def test_norm_quant_wide_rows_match_reference(K, mode, n):
    g = rng()
    x, w = nq_input(g, 2, n, True)
    check_norm_quant(K, mode, x, w, 2)


NQ_GENERIC = [
    (case, mode)
    for case in ("misaligned", "n%8", "huge")
    for mode in NQ_MODES
    if case != "n%8" or mode not in BLOCK  # Q8 rows are whole blocks
]


@pytest.mark.parametrize(("case", "mode"), NQ_GENERIC, ids=lambda v: getattr(v, "name", v))
@pytest.mark.parametrize("with_norm", [False, True])
def test_norm_quant_generic_path_matches_reference(K, mode, with_norm, case):
    """Rows the register path cannot take: x not 16-byte aligned, n % 8 != 0, n > 8 * 4 * 1024."""
    g = rng()
    t, n = {"misaligned": (4, 768), "n%8": (4, 100), "huge": (2, 33024)}[case]
    x, w = nq_input(g, t, n, with_norm)
    xd = None
    if case == "misaligned":
        xd = cp.asarray(np.concatenate([np.zeros(1, np.float32), x.ravel()]))[1:].reshape(t, n)
    check_norm_quant(K, mode, x, w, t, xd)


# ---- GEMV ----
def _cols(qt) -> int:
    return 96 if fmt(qt).block_elems == 32 else 768  # 3 blocks: not a multiple of the warp


@pytest.mark.parametrize("qt", QUANTS + FLOATS, ids=lambda q: q.name)
@pytest.mark.parametrize("t", [1, 11])
def test_gemv_matches_reference(K, qt, t):
    g = rng()
    rows, cols = 67, _cols(qt)  # rows not a multiple of the warps per block
    raw = random_quantized(qt, (rows, cols), g, 1 / np.sqrt(cols))
    bias = g.standard_normal(rows).astype(np.float32)
    resid = g.standard_normal((t, rows)).astype(np.float32)
    x = act_input(g, t, cols)
    w = DeviceWeight(cp, raw, qt, rows, cols, bias=bias)
    act = ActBuf(cp, cols, 16, w.vec_dot)
    norm_quant(K, cp.asarray(x), t, act=act)
    out = cp.empty((16, rows), np.float32)
    gemv(K, w, act, out, t, resid=cp.asarray(np.pad(resid, ((0, 16 - t), (0, 0)))))
    want = gemv_ref(raw, qt, x, bias, resid)
    assert rel(cp.asnumpy(out)[:t], want) < 1e-5


@pytest.mark.parametrize("qt", QUANTS, ids=lambda q: q.name)
@pytest.mark.parametrize("t", [9, 40, 75, 130])
def test_gemm_mma_matches_reference(device, qt, t):
    """A prompt chunk's GEMM on the int8 tensor cores (gemv.gemm_mma: experts_mma.cu's
    dense_mma, tiles of 64 tokens, the last one partial) with bias, residual and an output
    stride wider than the rows, against HostTier's formula."""
    from strata.gpu.gemv import gemm_mma

    K = Kernels(cp, device.warp_size, device.sm_count, arch=device.arch)
    if not K.int8_mma:
        pytest.skip(f"no int8 mma on {device.arch}")
    g = rng()
    rows, cols, ldo = 83, _cols(qt), 90  # rows past a block's 64, not a multiple of 16
    raw = random_quantized(qt, (rows, cols), g, 1 / np.sqrt(cols))
    bias = g.standard_normal(rows).astype(np.float32)
    resid = g.standard_normal((t, ldo)).astype(np.float32)
    x = act_input(g, t, cols)
    w = DeviceWeight(cp, raw, qt, rows, cols, bias=bias)
    act = ActBuf(cp, cols, 140, w.vec_dot)
    norm_quant(K, cp.asarray(x), t, act=act)
    out = cp.full((140, ldo), np.nan, np.float32)
    gemm_mma(K, w, act, out, t, resid=cp.asarray(resid), ldo=ldo)
    got = cp.asnumpy(out)
    assert rel(got[:t, :rows], gemv_ref(raw, qt, x, bias, resid[:, :rows])) < 1e-5
    assert np.isnan(got[:t, rows:]).all() and np.isnan(got[t:]).all()  # nothing else written


@pytest.mark.parametrize("qt", [QT.Q8_0, QT.IQ3_XXS, QT.F32], ids=lambda q: q.name)
def test_gemv_matches_itself_across_token_groups(K, qt):
    """A T > 1 GEMV's token passes dealt over 1, 2 or 3 blocks along y: the same bits."""
    g = rng()
    rows, cols, t = 37, _cols(qt), 19  # three passes of GEMV_NT = 8 tokens
    raw = random_quantized(qt, (rows, cols), g, 1 / np.sqrt(cols))
    x = act_input(g, t, cols)
    w = DeviceWeight(cp, raw, qt, rows, cols)
    act = ActBuf(cp, cols, 32, w.vec_dot)
    norm_quant(K, cp.asarray(x), t, act=act)
    outs = []
    for groups in (1, 2, 3):
        out = cp.full((32, rows), np.nan, np.float32)
        gemv(K, w, act, out, t, groups=groups)
        outs.append(cp.asnumpy(out)[:t])
    assert not np.isnan(outs[0]).any()
    np.testing.assert_array_equal(outs[1], outs[0])
    np.testing.assert_array_equal(outs[2], outs[0])
    assert rel(outs[0], gemv_ref(raw, qt, x)) < 1e-5


# ---- embedding ----
@pytest.mark.parametrize("qt", QUANTS + FLOATS, ids=lambda q: q.name)
def test_embed_is_bit_exact(K, qt):
    g = rng()
    v, d = 50, _cols(qt) * (1 if fmt(qt).block_elems > 32 else 4)
    raw = random_quantized(qt, (v, d), g, 1.0)
    ids = g.integers(0, v, size=6).astype(np.int32)
    table = DeviceWeight(cp, raw, qt, v, d)
    out = cp.empty((8, d), np.float32)
    embed(K, table, cp.asarray(ids), len(ids), out)
    np.testing.assert_array_equal(cp.asnumpy(out)[: len(ids)], embed_ref(raw, qt, ids))


# ---- q/k norm + RoPE + KV append ----
@pytest.mark.parametrize("qk_norm", [True, False])
def test_qk_norm_rope_kv_matches_reference(K, qk_norm):
    g = rng()
    h, gk, dh, dv = 8, 2, 128, 128
    t, pos0, s_cap = 3, 1000, 1024
    qkv = g.standard_normal((t, (h + gk) * dh + gk * dv)).astype(np.float32)
    qn = (1 + 0.1 * g.standard_normal(dh)).astype(np.float32) if qk_norm else None
    kn = (1 + 0.1 * g.standard_normal(dh)).astype(np.float32) if qk_norm else None
    inv = rope_inv_freq(dh, 1e6)
    q_out = cp.empty((t, h, dh), np.float32)
    kc = cp.zeros((gk, s_cap, dh), np.uint16)
    vc = cp.zeros((gk, s_cap, dv), np.uint16)
    qk_norm_rope_kv(
        K,
        cp.asarray(qkv),
        t,
        (h, gk, dh, dv),
        None if qn is None else cp.asarray(qn),
        None if kn is None else cp.asarray(kn),
        1e-6,
        cp.asarray(inv),
        pos0,
        q_out,
        kc,
        vc,
    )
    q_ref, k_ref, v_ref = qk_norm_rope_kv_ref(qkv, (h, gk, dh, dv), qn, kn, 1e-6, inv, pos0)
    # cos/sin of angles up to ~1000 rad: device and libm differ by an ulp or so, then f16
    assert rel(cp.asnumpy(q_out), q_ref) < 2e-3
    assert np.mean(cp.asnumpy(q_out) == q_ref) > 0.95
    k = cp.asnumpy(kc).view(np.float16)[:, pos0 : pos0 + t].transpose(1, 0, 2)
    assert rel(k.astype(np.float32), k_ref.astype(np.float32)) < 2e-3
    v = cp.asnumpy(vc).view(np.float16)[:, pos0 : pos0 + t].transpose(1, 0, 2)
    np.testing.assert_array_equal(v, v_ref)
    assert not cp.asnumpy(kc)[:, :pos0].any()  # nothing else written


# ---- attention ----
def attn_case(g, t, pos0, h, gk, dh, dv, s_cap, fill):
    """Fresh random q [T, H, Dh] (f16 values), k [S, G, Dh] / v [S, G, Dv] f16 for S = pos0 + T,
    and one layer's caches [G, S_cap, D] f16 holding them, `fill` past S."""
    s = pos0 + t
    q = g.standard_normal((t, h, dh)).astype(np.float16).astype(np.float32)
    k = g.standard_normal((s, gk, dh)).astype(np.float16)
    v = g.standard_normal((s, gk, dv)).astype(np.float16)
    kc = np.full((gk, s_cap, dh), fill, np.float16)
    vc = np.full((gk, s_cap, dv), fill, np.float16)
    kc[:, :s] = k.transpose(1, 0, 2)
    vc[:, :s] = v.transpose(1, 0, 2)
    return q, k, v, kc, vc


@pytest.mark.parametrize(
    "t,pos0,h,gk,dh",
    [(1, 0, 4, 2, 64), (1, 700, 8, 2, 128), (5, 300, 32, 4, 128), (9, 0, 4, 4, 64)],
)
def test_attention_matches_reference(K, t, pos0, h, gk, dh):
    s_cap = 1024
    q, k, v, kc, vc = attn_case(rng(), t, pos0, h, gk, dh, dh, s_cap, fill=0.0)
    ws = AttnWorkspace(cp, K, h, gk, s_cap, dh, 16)
    out = cp.empty((16, h * dh), np.float32)
    scale = float(np.float32(1.0 / np.sqrt(dh)))
    attention(
        K,
        ws,
        cp.asarray(q),
        cp.asarray(kc.view(np.uint16)),
        cp.asarray(vc.view(np.uint16)),
        t,
        pos0,
        (h, gk, dh, dh),
        scale,
        out,
    )
    want = attention_ref(q, k, v, pos0, scale)
    # each probability is rounded to f16 after normalizing; where it sits within float32 noise of
    # an f16 rounding midpoint either neighbour is right, so the bound grants one f16 step there
    err = np.abs(cp.asnumpy(out)[:t] - want)
    assert np.all(err <= 1e-5 * np.abs(want).max() + flip_allowance(q, k, v, pos0, scale))


def flip_allowance(q, k, v, pos0, scale, rel_noise=1e-5):
    """Per output [T, H*Dv]: sum over probabilities near an f16 midpoint of step * |v|."""
    t, h, dh = q.shape
    s, g, dv = v.shape
    rep = h // g
    qg = q.astype(np.float64).reshape(t, g, rep, dh)
    sc = np.einsum("tgrd,sgd->grts", qg, k.astype(np.float64)) * scale
    sc[..., np.arange(s)[None, :] > (pos0 + np.arange(t))[:, None]] = -np.inf
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    lo = p.astype(np.float16).astype(np.float64)
    hi = np.where(lo <= p, np.nextafter(lo.astype(np.float16), np.float16(1)), lo)
    lo = np.where(lo <= p, lo, np.nextafter(lo.astype(np.float16), np.float16(0)))
    step = hi.astype(np.float64) - lo.astype(np.float64)
    amb = np.abs(p - (lo + step / 2)) <= rel_noise * p
    return np.einsum("grts,sgd->tgrd", amb * step, np.abs(v.astype(np.float64))).reshape(t, -1)


@pytest.fixture(scope="module")
def K_mma(device):
    """Kernels that know the device's arch (K.int8_mma); skips where there is no tensor-core mma."""
    K = Kernels(cp, device.warp_size, device.sm_count, arch=device.arch)
    if not K.int8_mma:
        pytest.skip(f"no tensor-core mma on {device.arch}")
    return K


def check_attention_mma(K, g, t, pos0, h, gk, dh, dv, s_cap=1024):
    """attention_mma on fresh random inputs against attention_ref, with the cache past S = pos0
    + T full of NaN (never read into a result) and output rows past T left untouched."""
    from strata.gpu.attention import attention_mma

    q, k, v, kc, vc = attn_case(g, t, pos0, h, gk, dh, dv, s_cap, fill=np.nan)
    out = cp.full((t + 3, h * dv), 7.0, np.float32)
    scale = float(np.float32(1.0 / np.sqrt(dh)))
    attention_mma(
        K,
        cp.asarray(q),
        cp.asarray(kc.view(np.uint16)),
        cp.asarray(vc.view(np.uint16)),
        t,
        pos0,
        (h, gk, dh, dv),
        scale,
        out,
    )
    got = cp.asnumpy(out)
    want = attention_ref(q, k, v, pos0, scale)
    err = np.abs(got[:t] - want)
    assert np.all(err <= 1e-5 * np.abs(want).max() + flip_allowance(q, k, v, pos0, scale))
    assert np.all(got[t:] == 7.0)


@pytest.mark.parametrize(
    "t,pos0,h,gk,dh",
    [(64, 0, 32, 4, 128), (200, 300, 8, 2, 128), (37, 5, 4, 4, 64), (512, 0, 32, 4, 128)],
)
def test_attention_mma_matches_reference(K_mma, t, pos0, h, gk, dh):
    """Causal prefill on the f16 tensor cores (attention_mma.cu): whole and partial 64-row
    query tiles, a prompt after cached keys, GQA, against HostTier's attention core."""
    check_attention_mma(K_mma, rng(), t, pos0, h, gk, dh, dh)


def test_attention_mma_few_rows_and_shapes(K_mma):
    """One to three query rows (decode-sized calls) at tile-crossing positions, Dv != Dh, and
    shapes it refuses: Dh not a multiple of 16, Dh past 128, an int8 cache."""
    from strata.gpu.attention import attention_mma

    g = rng()
    for t, pos0 in ((1, 0), (2, 63), (3, 130)):
        check_attention_mma(K_mma, g, t, pos0, 8, 2, 128, 128, s_cap=256)
    check_attention_mma(K_mma, g, 3, 64, 4, 1, 128, 64, s_cap=256)
    check_attention_mma(K_mma, g, 2, 10, 2, 2, 16, 32, s_cap=64)
    q = cp.zeros((1, 4, 128), np.float32)
    kc = cp.zeros((2, 64, 128), np.uint16)
    out = cp.zeros((1, 4 * 128), np.float32)
    for dims in ((4, 2, 72, 72), (4, 2, 144, 144), (4, 3, 128, 128)):
        with pytest.raises(ValueError):
            attention_mma(K_mma, q, kc, kc, 1, 0, dims, 0.1, out)
    with pytest.raises(ValueError):
        attention_mma(
            K_mma, q, kc.view(np.int8), kc.view(np.int8), 1, 0, (4, 2, 128, 128), 0.1, out
        )


# ---- router ----
@pytest.mark.parametrize("renorm", [True, False])
def test_router_topk_matches_route_topk(K, renorm):
    g = rng()
    # E sets how many logits a lane holds (1, 2, 4, 8, 16, 32 at warp 32): one case each; 60 and
    # 1000 leave lanes without their last logit
    for t, e, k in ((6, 128, 8), (3, 60, 5), (2, 20, 4), (2, 256, 8), (2, 512, 8), (2, 1000, 8)):
        logits = (g.standard_normal((t, e)) * 3).astype(np.float32)
        logits[0, [7, e - 3]] = logits[0].max() + 1  # a tie at the top: the lower id first
        ids = cp.empty((t, k), np.int32)
        w = cp.empty((t, k), np.float32)
        slot_row = g.permutation(e).astype(np.int32)
        slot_row[g.integers(0, e, 10)] = -1  # experts not resident
        pair_slot = cp.full(t * k, -7, np.int32)
        pair_w = cp.empty(t * k, np.float32)
        router_topk(K, cp.asarray(logits), t, e, k, renorm, ids, w)
        want_ids, want_w, _ = route_topk(logits, k, renorm)
        np.testing.assert_array_equal(cp.asnumpy(ids), want_ids)
        np.testing.assert_allclose(cp.asnumpy(w), want_w, rtol=1e-5)
        # the pair list in the same launch: the same picks through the slot table
        ids2, w2 = cp.empty_like(ids), cp.empty_like(w)
        router_topk(K, cp.asarray(logits), t, e, k, renorm, ids2, w2,
                    cp.asarray(slot_row), pair_slot, pair_w)  # fmt: skip
        np.testing.assert_array_equal(cp.asnumpy(ids2), want_ids)
        np.testing.assert_array_equal(cp.asnumpy(pair_slot), slot_row[want_ids].ravel())
        np.testing.assert_array_equal(cp.asnumpy(pair_w), cp.asnumpy(w).ravel())


def test_group_pairs_on_card_matches_reference(K):
    """group_pairs.cu against pairs_card.group_pairs_ref: the pair slots, the order (stable by
    expert id), the tiles, their count and the counts added to a histogram, exactly; picks with
    no slot (not resident, -1, past E) left out; one expert taking most pairs (runs of many
    tiles), every expert once, a single pair, more experts than pairs."""
    from strata.gpu.experts import TileBufs
    from strata.gpu.pairs_card import group_pairs, group_pairs_ref, max_tiles

    g = rng()
    for p, e, nt in ((4096, 128, 32), (72, 128, 8), (1000, 60, 32), (1, 8, 32), (777, 512, 8),
                     (2048, 20, 8)):  # fmt: skip
        pop = g.dirichlet(np.full(e, 0.3))
        ids = g.choice(e, p, p=pop).astype(np.int32)
        ids[g.random(p) < 0.05] = -1
        ids[g.random(p) < 0.01] = e + 3  # out of range: no pick
        slot_row = g.permutation(4 * e)[:e].astype(np.int32)  # slots of another numbering
        slot_row[g.random(e) < 0.1] = -1  # not resident
        tiles = TileBufs(cp, p, 16)
        tiles.dev.fill(-7)
        pair_slot = cp.full(p, -7, np.int32)
        hist0 = g.integers(0, 1000, e).astype(np.int32)
        hist = cp.asarray(hist0)
        bound = group_pairs(K, cp.asarray(ids), p, cp.asarray(slot_row), e, nt, pair_slot,
                            tiles, hist)  # fmt: skip
        want_ps, order, ts, tf, tn, counts = group_pairs_ref(ids, slot_row, nt)
        n = int(cp.asnumpy(tiles.count)[0])
        assert n == ts.size <= bound == max_tiles(p, e, nt)
        np.testing.assert_array_equal(cp.asnumpy(pair_slot), want_ps)
        np.testing.assert_array_equal(cp.asnumpy(tiles.order)[: order.size], order)
        for got, want in ((tiles.slot, ts), (tiles.first, tf), (tiles.n, tn)):
            np.testing.assert_array_equal(cp.asnumpy(got)[:n], want)
        np.testing.assert_array_equal(cp.asnumpy(hist), hist0 + counts)
        assert order.size == int((want_ps >= 0).sum()) and tn.max(initial=0) <= nt


@pytest.mark.parametrize("v", [5000, 5001, 151936])  # 16-byte chunks (V % 4 == 0), or not
def test_argmax_and_silu(K, v):
    g = rng()
    logits = g.standard_normal((4, v)).astype(np.float32)
    logits[1, [10, 4000]] = 50.0  # tie: the lower index
    logits[2, [4001, 4002]] = 50.0  # a tie inside one 16-byte chunk
    logits[3, [4003, v - 1]] = 50.0  # one in the last chunk
    ids = cp.empty(4, np.int32)
    argmax_rows(K, cp.asarray(logits), 4, v, ids)
    np.testing.assert_array_equal(cp.asnumpy(ids), [np.argmax(r) for r in logits])
    a, b = (g.standard_normal(1000).astype(np.float32) * 4 for _ in range(2))
    out = cp.empty(1000, np.float32)
    silu_mul(K, cp.asarray(a), cp.asarray(b), out, 1000)
    np.testing.assert_allclose(cp.asnumpy(out), silu_mul_ref(a, b), rtol=1e-6, atol=1e-7)


def _f16_inputs(g, halves):
    return np.concatenate(
        [
            g.standard_normal(50000).astype(np.float32)
            * np.float32(10.0) ** g.integers(-9, 6, 50000),
            halves.view(np.float16).astype(np.float32),  # exact f16 values
            (halves.view(np.float16).astype(np.float32) * np.float32(1 + 2**-11)),  # ties
            np.array([65504, 65519.99, 65520, 1e-8, -6e-8, 3e-8, np.inf, -np.inf], np.float32),
        ]
    ).astype(np.float32)


def test_f16_conversions_are_exact(K):
    g = rng()
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every f16 value
    with np.errstate(invalid="ignore"):  # the NaN halves
        x = _f16_inputs(g, halves)
    n = max(len(halves), len(x))
    hin = np.resize(halves, n)
    x = np.resize(x, n)
    fout, hout = cp.empty(n, np.float32), cp.empty(n, np.uint16)
    f16_convert(K, cp.asarray(hin), fout, cp.asarray(x), hout, n)
    want_f = hin.view(np.float16).astype(np.float32)
    got_f = cp.asnumpy(fout)
    nan = np.isnan(want_f)
    np.testing.assert_array_equal(np.isnan(got_f), nan)
    np.testing.assert_array_equal(got_f[~nan].view(np.uint32), want_f[~nan].view(np.uint32))
    with np.errstate(over="ignore"):
        want_h = x.astype(np.float16).view(np.uint16)
    finite = np.isfinite(x)
    np.testing.assert_array_equal(cp.asnumpy(hout)[finite], want_h[finite])


# ---- resident experts ----
# the decode kernel pairs experts.MOE_KERNELS_BY_TYPE picks from (gate/up, down)
MOE_PAIRS = [
    ("moe_gate_up", "moe_down"),
    ("moe_gate_up", "moe_down_sp2"),
    ("moe_gate_up_st1", "moe_down"),
    ("moe_gate_up_st1", "moe_down_sp2"),
]


def use_moe_kernels(monkeypatch, qt, pair) -> None:
    """Make moe_experts take the decode kernel pair `pair` for gate/up experts of type qt."""
    from strata.gpu import experts as ex

    monkeypatch.setitem(ex.MOE_KERNELS_BY_TYPE, QT(int(qt)), tuple(pair))


@pytest.mark.parametrize(
    "qts",
    [(QT.Q4_K, QT.Q4_K, QT.Q6_K), (QT.IQ3_XXS, QT.IQ3_XXS, QT.IQ3_XXS), (QT.Q8_0,) * 3]
    + [(q, q, q) for q in (QT.Q5_K, QT.IQ4_XS, QT.IQ3_S, QT.IQ2_XXS, QT.IQ2_S, QT.IQ1_M)]
    + [(QT.MXFP4, QT.MXFP4, QT.MXFP4)],
    ids=lambda q: "-".join(x.name for x in q),
)
@pytest.mark.parametrize("pair", MOE_PAIRS, ids=lambda p: "+".join(p))
def test_moe_experts_match_reference(K, qts, pair, monkeypatch):
    use_moe_kernels(monkeypatch, qts[0], pair)
    g = rng()
    d, f, n_exp, t, k = 512, 256, 6, 3, 4
    raws = [
        random_quantized(qts[0], (n_exp, f, d), g, 1 / np.sqrt(d)),
        random_quantized(qts[1], (n_exp, f, d), g, 1 / np.sqrt(d)),
        random_quantized(qts[2], (n_exp, d, f), g, 1 / np.sqrt(f)),
    ]
    stores = [SlotStore(cp, n_exp + 1, r[0].nbytes) for r in raws]
    perm = g.permutation(n_exp + 1)[:n_exp]  # expert e lives in slot perm[e]
    for st, r in zip(stores, raws, strict=True):
        host = np.zeros((n_exp + 1, r[0].nbytes), np.uint8)
        host[perm] = r.reshape(n_exp, -1)
        st.buf[...] = cp.asarray(host)
    h = act_input(g, t, d)
    ids = np.stack([g.permutation(n_exp)[:k] for _ in range(t)]).astype(np.int32)
    ids[1, 2] = -1  # a missed expert: skipped
    w = g.uniform(0.1, 1, (t, k)).astype(np.float32)
    slots = np.where(ids >= 0, perm[np.maximum(ids, 0)], -1).astype(np.int32)
    hact = ActBuf(cp, d, 8, fmt(qts[0]).vec_dot)
    norm_quant(K, cp.asarray(h), t, act=hact)
    act = cp.zeros((8 * k, f), np.float32)  # skipped pairs leave their rows as they were
    aact = ActBuf(cp, f, 8 * k, fmt(qts[2]).vec_dot)
    out = cp.empty((8, d), np.float32)
    moe_experts(
        K,
        qts,
        (d, f),
        stores,
        hact,
        cp.asarray(slots.ravel()),
        cp.asarray(w.ravel()),
        t,
        k,
        act,
        aact,
        out,
    )
    # the intermediate: silu(gate) * up from the same Q8 h (bit-exact quantization) -> 1e-5
    gq = fmt(qts[0]).vec_dot
    act_dev = cp.asnumpy(act)[: t * k].reshape(t, k, f)
    shapes = ((f, d), (f, d), (d, f))
    deq = [dequantize(r, q).reshape(n_exp, *sh) for r, q, sh in zip(raws, qts, shapes, strict=True)]
    hr = roundtrip(h, gq)
    # the output, from the device's own Q8 intermediate (a flip there is no error of moe_down)
    aq = cp.asnumpy(aact.q)[: t * k].reshape(t, k, f).astype(np.float32)
    nb = f // (256 if fmt(qts[2]).vec_dot == QT.Q8_K else 32)
    ad = cp.asnumpy(aact.d).ravel()[: t * k * nb].reshape(t, k, nb)
    a_deq = (aq.reshape(t, k, nb, -1) * ad[..., None]).reshape(t, k, f)
    want = np.zeros((t, d), np.float32)
    flips = 0  # intermediate quants where the host's own float intermediate rounds otherwise
    for ti in range(t):
        for ki in range(k):
            e = ids[ti, ki]
            if e < 0:
                continue
            g_ = hr[ti] @ deq[0][e].T
            u_ = hr[ti] @ deq[1][e].T
            inter = g_ / (np.float32(1) + np.exp(-g_)) * u_
            assert rel(act_dev[ti, ki], inter) < 1e-5
            # the device quantizes its own intermediate exactly as the host quantizer would ...
            dq = fmt(qts[2]).vec_dot
            np.testing.assert_array_equal(roundtrip(act_dev[ti, ki][None], dq)[0], a_deq[ti, ki])
            # ... so where the host's float intermediate rounds otherwise, it is float noise
            flips += int(np.count_nonzero(roundtrip(inter[None], dq)[0] != a_deq[ti, ki]))
            want[ti] += w[ti, ki] * (a_deq[ti, ki] @ deq[2][e].T)
    assert rel(cp.asnumpy(out)[:t], want) < 1e-5
    # and the whole expert against HostTier's formula: float32 noise on a .5 boundary may flip
    # an intermediate quant by one (or a block's scale), each flip moving the output by up to
    # ~5e-3 relative at these sizes
    ref = np.zeros((t, d), np.float32)
    for ti in range(t):
        for ki in range(k):
            e = ids[ti, ki]
            if e >= 0:
                y = expert_ref(h[ti : ti + 1], raws[0][e], raws[1][e], raws[2][e], qts)
                ref[ti] += w[ti, ki] * y[0]
    assert rel(cp.asnumpy(out)[:t], ref) < 5e-3 * max(1, flips)
    # the residual added by the down kernel (all-resident graph steps): resid + the sum, exactly
    resid = g.standard_normal((8, d)).astype(np.float32)
    out_r = cp.empty((8, d), np.float32)
    moe_experts(K, qts, (d, f), stores, hact, cp.asarray(slots.ravel()), cp.asarray(w.ravel()),
                t, k, act, aact, out_r, resid=cp.asarray(resid))  # fmt: skip
    np.testing.assert_array_equal(cp.asnumpy(out_r)[:t], resid[:t] + cp.asnumpy(out)[:t])


# ---- the decode GEMV and the MoE decode kernels, bit for bit ----
@pytest.mark.parametrize("qt", QUANTS, ids=lambda q: q.name)
@pytest.mark.parametrize("cols_blocks", [3, 10])  # one chunk; several with a short last one
def test_gemv1_misaligned_rows_give_the_same_bits(K, qt, cols_blocks):
    """gemv1w_* on rows 2 bytes off any wider alignment (decoders that take 8- or 16-byte loads
    on aligned blocks fall back to 2-byte loads) gives the aligned rows' bits."""
    g = rng()
    rows, cols = 67, cols_blocks * fmt(qt).block_elems * (8 if fmt(qt).block_elems == 32 else 1)
    raw = random_quantized(qt, (rows, cols), g, 1 / np.sqrt(cols))
    bias = g.standard_normal(rows).astype(np.float32)
    x = act_input(g, 1, cols)
    w = DeviceWeight(cp, raw, qt, rows, cols, bias=bias)
    act = ActBuf(cp, cols, 1, w.vec_dot)
    norm_quant(K, cp.asarray(x), 1, act=act)
    out = cp.zeros((1, rows), np.float32)
    gemv(K, w, act, out, 1)
    aligned = cp.asnumpy(out)
    shifted = cp.zeros(w.buf.size + 16, np.uint8)
    w.buf = shifted[2 : 2 + w.buf.size].reshape(w.buf.shape)
    w.buf[...] = cp.asarray(np.ascontiguousarray(raw).view(np.uint8).reshape(w.buf.shape))
    out = cp.zeros((1, rows), np.float32)
    gemv(K, w, act, out, 1)
    assert rel(aligned, gemv_ref(raw, qt, x, bias)) < 1e-5
    np.testing.assert_array_equal(cp.asnumpy(out), aligned)


def _expert_slots(g, qt, n_exp: int, d: int, f: int) -> list:
    """Random gate/up/down experts of type qt, expert e in slot e of three SlotStores."""
    stores = []
    for shape, cols in (((n_exp, f, d), d), ((n_exp, f, d), d), ((n_exp, d, f), f)):
        r = random_quantized(qt, shape, g, 1 / np.sqrt(cols))
        st = SlotStore(cp, n_exp, r[0].nbytes)
        st.buf[...] = cp.asarray(np.ascontiguousarray(r).reshape(n_exp, -1).view(np.uint8))
        stores.append(st)
    return stores


@pytest.mark.parametrize("qt", QUANTS, ids=lambda q: q.name)
def test_moe_decode_kernel_pairs_give_the_same_bits(K, qt, monkeypatch):
    """Every decode kernel pair gives moe_gate_up + moe_down's bits (K = 8, T = 2), with and
    without the residual added by the down kernel."""
    g = rng()
    d, f, n_exp, t, k = 1024, 768, 9, 2, 8  # f = 768: the Qwen3 down row, one short chunk
    stores = _expert_slots(g, qt, n_exp, d, f)
    slots = np.stack([g.permutation(n_exp)[:k] for _ in range(t)]).astype(np.int32)
    slots[1, 3] = -1
    ps, pw = cp.asarray(slots.ravel()), cp.asarray(g.uniform(0.1, 1, t * k).astype(np.float32))
    vd = fmt(qt).vec_dot
    hact = ActBuf(cp, d, t, vd)
    norm_quant(K, cp.asarray(act_input(g, t, d)), t, act=hact)
    resid = g.standard_normal((t, d)).astype(np.float32)
    outs = {}
    for pair in MOE_PAIRS:
        use_moe_kernels(monkeypatch, qt, pair)
        act = cp.zeros((t * k, f), np.float32)
        aact = ActBuf(cp, f, t * k, vd)
        out, out_r = cp.zeros((t, d), np.float32), cp.zeros((t, d), np.float32)
        moe_experts(K, (qt,) * 3, (d, f), stores, hact, ps, pw, t, k, act, aact, out)
        moe_experts(K, (qt,) * 3, (d, f), stores, hact, ps, pw, t, k, act, aact, out_r,
                    resid=cp.asarray(resid))  # fmt: skip
        outs[pair] = (cp.asnumpy(act), cp.asnumpy(out), cp.asnumpy(out_r))
    a0, o0, _ = outs[MOE_PAIRS[0]]
    for pair, (a, o, o_r) in outs.items():
        np.testing.assert_array_equal(a, a0, err_msg=str(pair))
        np.testing.assert_array_equal(o, o0, err_msg=str(pair))
        np.testing.assert_array_equal(o_r, resid + o0, err_msg=str(pair))
