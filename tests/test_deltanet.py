"""The gated DeltaNet pieces (qwen3next): the chunked form equals the recurrence, the Numba
kernels equal their NumPy references, and a prompt fed in chunks leaves the state its tokens
fed one by one leave."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cpu import deltanet as dn
from strata.model import reference_deltanet as rd


def _inputs(rng, t=37, hv=4, dk=16, dtype=np.float64):
    q = rd.l2_norm(rng.standard_normal((t, hv, dk)), 1e-6)
    k = rd.l2_norm(rng.standard_normal((t, hv, dk)), 1e-6)
    v = rng.standard_normal((t, hv, dk))
    g = -rng.uniform(0.01, 0.7, (t, hv))
    beta = rd.sigmoid(rng.standard_normal((t, hv)))
    m = 0.3 * rng.standard_normal((hv, dk, dk))
    return [np.ascontiguousarray(x, dtype) for x in (q, k, v, g, beta, m)]


@pytest.mark.parametrize("t,chunk", [(1, 64), (37, 8), (150, 64), (64, 64)])
def test_chunked_delta_rule_equals_the_recurrence(t, chunk):
    q, k, v, g, beta, m0 = _inputs(np.random.default_rng(t), t=t)
    m1, m2 = m0.copy(), m0.copy()
    o1 = rd.delta_rule(q, k, v, g, beta, m1)
    o2 = rd.delta_rule_chunked(q, k, v, g, beta, m2, chunk=chunk)
    np.testing.assert_allclose(o2, o1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m2, m1, rtol=0, atol=1e-12)


def test_delta_step_by_definition():
    """One token: decay, then the delta rule's correction, then the read."""
    q, k, v, g, beta, m = _inputs(np.random.default_rng(5), t=1, hv=2, dk=8)
    h = 1
    s = m[h] * np.exp(g[0, h])
    d = beta[0, h] * (v[0, h] - s @ k[0, h])
    s = s + np.outer(d, k[0, h])
    want = s @ q[0, h] / np.sqrt(8)
    o = rd.delta_step(m, q[0], k[0], v[0], g[0], beta[0])
    np.testing.assert_allclose(o[h], want, rtol=1e-13)
    np.testing.assert_allclose(m[h], s, rtol=1e-13)


def test_kernel_delta_rule_equals_its_reference():
    q, k, v, g, beta, m0 = _inputs(np.random.default_rng(11), t=9, dtype=np.float32)
    m1, m2 = m0.copy(), m0.copy()
    o1 = dn.delta_rule_ref(q, k, v, g, beta, m1)
    o2 = dn.delta_rule(q, k, v, g, beta, m2)
    np.testing.assert_allclose(o2, o1, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(m2, m1, rtol=2e-5, atol=2e-6)
    # and both are the float64 definition to float32 noise
    m3 = m0.astype(np.float64)
    o3 = rd.delta_rule(*(x.astype(np.float64) for x in (q, k, v, g, beta)), m3)
    np.testing.assert_allclose(o2, o3, rtol=1e-4, atol=1e-5)


def test_kernel_conv_equals_its_reference():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((7, 24)).astype(np.float32)
    w = rng.standard_normal((24, 4)).astype(np.float32)
    s0 = rng.standard_normal((3, 24)).astype(np.float32)
    s1, s2 = s0.copy(), s0.copy()
    y1 = dn.conv_ref(x, s1, w)
    y2 = dn.conv(x, s2, w)
    np.testing.assert_array_equal(y2, y1)
    np.testing.assert_array_equal(s2, s1)
    y3, s3 = rd.causal_conv(x.astype(np.float64), s0.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(y1, y3, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(s1, s3.astype(np.float32))


@pytest.mark.parametrize("cuts", [[5], [1, 2, 3], [4, 4, 4]])
def test_chunked_prompt_leaves_the_state_of_one_by_one(cuts):
    """Kernels: conv and delta rule over a prompt cut in pieces == the same tokens one at a time,
    bit for bit (the same sums in the same order)."""
    rng = np.random.default_rng(sum(cuts))
    t = sum(cuts)
    q, k, v, g, beta, m0 = _inputs(rng, t=t, dtype=np.float32)
    x = rng.standard_normal((t, 24)).astype(np.float32)
    w = rng.standard_normal((24, 4)).astype(np.float32)
    ma, mb = m0.copy(), m0.copy()
    ca, cb = np.zeros((3, 24), np.float32), np.zeros((3, 24), np.float32)
    oa, ya, ob, yb = [], [], [], []
    lo = 0
    for n in cuts:
        sl = slice(lo, lo + n)
        oa.append(dn.delta_rule(q[sl], k[sl], v[sl], g[sl], beta[sl], ma))
        ya.append(dn.conv(x[sl], ca, w))
        lo += n
    for i in range(t):
        sl = slice(i, i + 1)
        ob.append(dn.delta_rule(q[sl], k[sl], v[sl], g[sl], beta[sl], mb))
        yb.append(dn.conv(x[sl], cb, w))
    np.testing.assert_array_equal(ma, mb)
    np.testing.assert_array_equal(ca, cb)
    np.testing.assert_array_equal(np.concatenate(oa), np.concatenate(ob))
    np.testing.assert_array_equal(np.concatenate(ya), np.concatenate(yb))


def test_l2_norm_places_eps_inside_the_sum():
    x = np.array([[3.0, 4.0]], np.float32)
    got = dn.l2_norm(x, np.float32(1e-6))
    np.testing.assert_allclose(got, x / np.sqrt(25 + 1e-6), rtol=1e-6)
    np.testing.assert_allclose(rd.l2_norm(x.astype(np.float64), 1e-6), x / np.sqrt(25 + 1e-6))


def test_legacy_qkvz_split_matches_the_split_layout():
    """ssm_in (per key head [q, k, v, z]) reorders to attn_qkv's [all q, all k, all v] + z."""
    hk, dk, rv = 2, 3, 4  # rv = Dv * Hv/Hk
    per = np.arange(hk * (2 * dk + 2 * rv)).reshape(1, hk, -1)
    qkv, z = rd.split_legacy_qkvz(per.reshape(1, -1).astype(np.float64), hk, dk)
    want_q = per[0, :, :dk].ravel()
    want_v = per[0, :, 2 * dk : 2 * dk + rv].ravel()
    np.testing.assert_array_equal(qkv[0, : hk * dk], want_q)
    np.testing.assert_array_equal(qkv[0, 2 * hk * dk :], want_v)
    np.testing.assert_array_equal(z[0], per[0, :, 2 * dk + rv :].ravel())
