"""The grouped (prefill) expert kernels against the per-pair ones (kernels/experts_grouped.cu).

The intermediate silu(gate)*up is summed in the per-pair kernel's order, so it must be
bit-identical; the output sums each pair's down row before the weighted sum over k (the per-pair
kernel interleaves the pairs across lanes), so it agrees to float32 summation noise.
"""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from gguf.constants import GGMLQuantizationType  # noqa: E402

from strata.gpu.experts import (  # noqa: E402
    SlotStore,
    TileBufs,
    moe_experts,
    moe_experts_grouped,
)
from strata.gpu.norm_quant import ActBuf, norm_quant  # noqa: E402
from strata.quant import fmt  # noqa: E402
from strata.quant.synth_blocks import random_quantized  # noqa: E402

QT = GGMLQuantizationType
pytestmark = pytest.mark.gpu


N_EXP, PICKS = 6, 4  # experts in the slots, picks per token


def experts_case(K, qts, d: int, f: int, t: int):
    """Random experts of types qts in N_EXP slots, skewed picks [T, PICKS] (expert 0 popular:
    full tiles and a remainder) with a few skipped, weights, h [T, D] and its Q8 ActBuf ->
    (raws, stores, slots, w, h, hact)."""
    g = np.random.default_rng()
    shapes = ((N_EXP, f, d), (N_EXP, f, d), (N_EXP, d, f))
    raws = [random_quantized(q, s, g, 1 / np.sqrt(s[2])) for q, s in zip(qts, shapes, strict=True)]
    stores = [SlotStore(cp, N_EXP, r[0].nbytes) for r in raws]
    for st, r in zip(stores, raws, strict=True):
        st.buf[...] = cp.asarray(r.reshape(N_EXP, -1))
    p = [0.5, 0.3, 0.05, 0.05, 0.05, 0.05]
    slots = np.stack([g.choice(N_EXP, PICKS, replace=False, p=p) for _ in range(t)])
    slots = slots.astype(np.int32)
    slots[g.random((t, PICKS)) < 0.15] = -1
    w = g.uniform(0.1, 1, (t, PICKS)).astype(np.float32)
    h = g.standard_normal((t, d)).astype(np.float32)
    hact = ActBuf(cp, d, t, fmt(qts[0]).vec_dot)
    norm_quant(K, cp.asarray(h), t, act=hact)
    return raws, stores, slots, w, h, hact


@pytest.mark.parametrize(
    "qts",
    [
        (QT.Q4_K, QT.Q4_K, QT.Q6_K),
        (QT.IQ3_XXS,) * 3,
        (QT.Q8_0,) * 3,
        (QT.IQ1_M,) * 3,
        (QT.MXFP4,) * 3,
    ],
    ids=lambda q: "-".join(x.name for x in q),
)
@pytest.mark.parametrize("t", [9, 37])
def test_grouped_experts_equal_the_per_pair_kernels(K, qts, t):
    d, f, k = 512, 256, PICKS
    _, stores, slots, w, _, hact = experts_case(K, qts, d, f, t)
    ps, pw = cp.asarray(slots.ravel()), cp.asarray(w.ravel())
    outs, acts = [], []
    for grouped in (False, True):
        act = cp.zeros((t * k, f), np.float32)
        aact = ActBuf(cp, f, t * k, fmt(qts[2]).vec_dot)
        out = cp.full((t, d), np.nan, np.float32)
        if grouped:
            tiles = TileBufs(cp, t * k, d)
            moe_experts_grouped(K, qts, (d, f), stores, hact, slots, ps, pw, tiles, act, aact, out)
        else:
            moe_experts(K, qts, (d, f), stores, hact, ps, pw, t, k, act, aact, out)
        outs.append(cp.asnumpy(out))
        acts.append(cp.asnumpy(act))
    valid = (slots >= 0).ravel()
    np.testing.assert_array_equal(acts[1][valid], acts[0][valid])  # the same bits
    ref = outs[0]
    assert np.all(np.isfinite(outs[1]))
    err = np.abs(outs[1] - ref).max() / np.abs(ref).max()
    assert err < 1e-5, err
    dead = (slots < 0).all(axis=1)  # a token whose picks all missed: zeros
    assert np.all(outs[1][dead] == 0)


@pytest.mark.parametrize(
    "qts,d,f",
    [
        ((QT.Q4_K, QT.Q4_K, QT.Q6_K), 512, 256),
        ((QT.IQ3_XXS,) * 3, 512, 256),
        ((QT.Q5_K, QT.Q5_K, QT.Q8_0), 256, 256),
        ((QT.IQ4_XS, QT.IQ4_XS, QT.IQ2_XXS), 256, 512),
        ((QT.IQ1_M, QT.IQ1_M, QT.IQ3_S), 512, 256),
        ((QT.IQ2_S,) * 3, 256, 256),
        ((QT.MXFP4,) * 3, 160, 96),  # 17-byte blocks: rows at every byte offset
        ((QT.Q8_0,) * 3, 96, 160),  # rows past a block's 64 (early-leaving warps), odd sub-blocks
    ],
    ids=lambda v: "-".join(x.name for x in v) if isinstance(v, tuple) else str(v),
)
@pytest.mark.parametrize("t", [9, 150])
def test_mma_tiles_match_the_reference(device, qts, d, f, t):
    """The tensor-core tile kernels (kernels/experts_mma.cu, tiles of up to 32 pairs, column
    blocks partly used) against float64 NumPy on the same Q8 inputs: the intermediate to 1e-5
    (its sums are exact int32 a sub-block, float order aside) and the output to 1e-5 from the
    card's own Q8 intermediate (a quantization flip is no error of the down kernel)."""
    from gguf.quants import dequantize

    from strata.gpu.rawmod import Kernels
    from strata.quant.activation import roundtrip

    K = Kernels(cp, device.warp_size, device.sm_count, arch=device.arch)
    if not K.int8_mma:
        pytest.skip(f"no int8 mma on {device.arch}")
    k = PICKS
    raws, stores, slots, w, h, hact = experts_case(K, qts, d, f, t)
    act = cp.zeros((t * k, f), np.float32)
    aact = ActBuf(cp, f, t * k, fmt(qts[2]).vec_dot)
    out = cp.full((t, d), np.nan, np.float32)
    tiles = TileBufs(cp, t * k, d)
    ps, pw = cp.asarray(slots.ravel()), cp.asarray(w.ravel())
    moe_experts_grouped(
        K, qts, (d, f), stores, hact, slots, ps, pw, tiles, act, aact, out, mma=True
    )
    deq = [dequantize(r, q).reshape(*r.shape[:2], -1) for r, q in zip(raws, qts, strict=True)]
    deq = [x.astype(np.float64) for x in deq]
    hq = roundtrip(h, fmt(qts[0]).vec_dot).astype(np.float64)  # the Q8 h the card multiplies
    act_dev = cp.asnumpy(act).reshape(t, k, f)
    aq = cp.asnumpy(aact.q)[: t * k].astype(np.float64)
    nb = f // (256 if fmt(qts[2]).vec_dot == QT.Q8_K else 32)
    ad = cp.asnumpy(aact.d).ravel()[: t * k * nb].reshape(t * k, nb)
    a_deq = (aq.reshape(t * k, nb, -1) * ad[..., None]).reshape(t, k, f)
    want = np.zeros((t, d))
    for ti in range(t):
        for ki in range(k):
            e = slots[ti, ki]
            if e < 0:
                continue
            gg, uu = hq[ti] @ deq[0][e].T, hq[ti] @ deq[1][e].T
            inter = gg / (1 + np.exp(-gg)) * uu
            err = np.abs(act_dev[ti, ki] - inter).max() / np.abs(inter).max()
            assert err < 1e-5, (ti, ki, err)
            want[ti] += w[ti, ki] * (a_deq[ti, ki] @ deq[2][e].T)
    got = cp.asnumpy(out)
    assert np.all(np.isfinite(got))
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-5, err
    assert np.all(got[(slots < 0).all(axis=1)] == 0)


@pytest.mark.parametrize(
    "qts",
    [(QT.IQ3_XXS,) * 3, (QT.Q4_K, QT.Q4_K, QT.Q6_K)],
    ids=lambda q: "-".join(x.name for x in q),
)
@pytest.mark.parametrize("t", [9, 150])
@pytest.mark.parametrize("mma", [False, True])
def test_card_grouped_tiles_give_the_host_grouped_bits(device, qts, t, mma):
    """The pairs grouped on the card (pairs_card.group_pairs: by expert id, the tile count read
    by the kernels, a grid of the tile bound) against the host's grouping (by slot): each pair's
    sums do not depend on its tile, so the intermediate and the output are the same bits; the
    picks are expert ids through a slot table that leaves some experts out."""
    from strata.gpu.experts import tile_pairs
    from strata.gpu.pairs_card import group_pairs
    from strata.gpu.rawmod import Kernels

    K = Kernels(cp, device.warp_size, device.sm_count, arch=device.arch)
    if mma and not K.int8_mma:
        pytest.skip(f"no int8 mma on {device.arch}")
    d, f, k = 256, 256, PICKS
    _, stores, slots, w, _, hact = experts_case(K, qts, d, f, t)
    g = np.random.default_rng()
    ids = np.where(slots >= 0, g.permutation(N_EXP)[np.maximum(slots, 0)], -1)  # expert ids
    slot_row = np.zeros(N_EXP, np.int32)
    slot_row[ids[slots >= 0]] = slots[slots >= 0]  # the expert -> slot table the ids go through
    gone = ids[slots >= 0][0]
    slot_row[gone] = -1  # an expert not resident: its picks are skipped on both sides
    host_slots = np.where(ids >= 0, slot_row[np.maximum(ids, 0)], -1).astype(np.int32)
    res = []
    for card in (False, True):
        act = cp.zeros((t * k, f), np.float32)
        aact = ActBuf(cp, f, t * k, fmt(qts[2]).vec_dot)
        out = cp.full((t, d), np.nan, np.float32)
        tiles = TileBufs(cp, t * k, d)
        pw = cp.asarray(w.ravel())
        if card:
            ps = cp.full(t * k, -7, np.int32)
            flat = cp.asarray(ids.ravel().astype(np.int32))
            nt = tile_pairs(mma)
            bound = group_pairs(K, flat, t * k, cp.asarray(slot_row), N_EXP, nt, ps, tiles)
            moe_experts_grouped(K, qts, (d, f), stores, hact, None, ps, pw, tiles, act, aact,
                                out, mma=mma, card=(t, k, bound))  # fmt: skip
            np.testing.assert_array_equal(cp.asnumpy(ps), host_slots.ravel())
        else:
            ps = cp.asarray(host_slots.ravel())
            moe_experts_grouped(K, qts, (d, f), stores, hact, host_slots, ps, pw, tiles, act,
                                aact, out, mma=mma)  # fmt: skip
        res.append((cp.asnumpy(act), cp.asnumpy(out)))
    live = host_slots.ravel() >= 0
    assert live.sum() < live.size  # some pairs skipped
    np.testing.assert_array_equal(res[1][0][live], res[0][0][live])
    np.testing.assert_array_equal(res[1][1], res[0][1])
    assert np.all(np.isfinite(res[1][1]))
