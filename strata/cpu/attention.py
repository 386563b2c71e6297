"""The host tier's decode attention as a job of the resident team: one query row against the
f16 KV cache, the heads of each KV group on one thread.

    H = query heads, G = KV heads, R = H / G, Dh = head dim, Dv = value head dim,
    S = positions in the cache

`_attend` computes what `HostTier.attention` (strata/cpu/tier.py, NumPy: the reference the tests
hold it to) computes for T = 1: q rounded to f16, scores against the f16 K rows, softmax, the
probabilities rounded to f16 (llama.cpp's f16 attention), the sum of the f16 V rows; the float
sums run in another order than NumPy/BLAS (float noise).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from strata.cpu.kernels.common import bits_f32, f16_bits_to_f32, round_f16
from strata.cpu.kernels.dispatch import native_address
from strata.cpu.kernels.features import HAS_AVX2
from strata.cpu.kernels.simd import f16x8_to_f32
from strata.cpu.team import address


@njit(cache=True, nogil=True, inline="always")
def _row_f32(src, dst):
    """dst [Dh] = the f16 row src [Dh] (uint16 bits) as float32."""
    n = src.shape[0]
    if HAS_AVX2 and n % 8 == 0:
        for i in range(0, n, 8):
            f16x8_to_f32(src, i, dst, i)
    else:
        for i in range(n):
            dst[i] = f16_bits_to_f32(src[i])


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz", "contract"})
def _attend(q, kc, vc, s_n, n_head, n_kv, dh, dv, scale, sc, kt, out, g0, g1):
    """out [H * Dv] = softmax(q K^T * scale) V over positions 0..S-1 for the heads of KV groups
    g0..g1-1: q [H * Dh] already rounded to f16, K/V rows f16 (kc [S, G, Dh], vc [S, G, Dv]
    uint16), probabilities rounded to f16 (llama.cpp's f16 attention); sc [R, S] and kt
    [max(Dh, Dv)] scratch. The sums are reassociated (vectorized over Dh: 5x faster, where the loops
    index views from 0; with an offset of unknown sign Numba's wraparound check keeps them
    scalar)."""
    rep = n_head // n_kv
    for g in range(g0, g1):
        for s in range(s_n):
            _row_f32(kc[s, g], kt)
            for r in range(rep):
                qh = q[(g * rep + r) * dh :]  # (views: indices from 0 need no wraparound)
                acc = np.float32(0.0)
                for d in range(dh):
                    acc += qh[d] * kt[d]
                sc[r, s] = acc * scale
        for r in range(rep):
            m = sc[r, 0]
            for s in range(1, s_n):
                m = max(m, sc[r, s])
            tot = np.float32(0.0)
            for s in range(s_n):
                e = np.exp(sc[r, s] - m)
                sc[r, s] = e
                tot += e
            for s in range(s_n):
                sc[r, s] = round_f16(sc[r, s] / tot)
            out[(g * rep + r) * dv : (g * rep + r + 1) * dv] = 0.0
        for s in range(s_n):
            _row_f32(vc[s, g], kt)
            for r in range(rep):
                p = sc[r, s]
                oh = out[(g * rep + r) * dv :]
                for d in range(dv):
                    oh[d] += p * kt[d]


# an attention job (int64 [AJ_LEN]): q, the layer's K and V cache, out, the threads' scratch
# (sc [nt, R, S_ctx], kt [nt, Dk]) by address; positions, H, G, Dh, Dv, S_ctx, Dk, scale bits
AJ_Q, AJ_KC, AJ_VC, AJ_OUT, AJ_SC, AJ_KT = range(6)
AJ_S, AJ_H, AJ_G, AJ_DH, AJ_DV, AJ_CTX, AJ_DK, AJ_SCALE = range(6, 14)
AJ_LEN = 14


@njit(cache=True, nogil=True)
def _attn_share(tid, nt, jaddr, z0, z1, z2):
    """Thread tid's KV groups of the attention job at jaddr (an even split of the G groups)."""
    job = numba.carray(address(jaddr), (AJ_LEN,), np.int64)
    n_head, n_kv, dh, dv = job[AJ_H], job[AJ_G], job[AJ_DH], job[AJ_DV]
    ctx, dk = job[AJ_CTX], job[AJ_DK]
    g0, g1 = n_kv * tid // nt, n_kv * (tid + 1) // nt
    if g0 == g1 or tid >= nt:
        return 0
    rep = n_head // n_kv
    q = numba.carray(address(job[AJ_Q]), (n_head * dh,), np.float32)
    kc = numba.carray(address(job[AJ_KC]), (ctx, n_kv, dh), np.uint16)
    vc = numba.carray(address(job[AJ_VC]), (ctx, n_kv, dv), np.uint16)
    out = numba.carray(address(job[AJ_OUT]), (n_head * dv,), np.float32)
    sc = numba.carray(address(job[AJ_SC] + tid * rep * ctx * 4), (rep, ctx), np.float32)
    kt = numba.carray(address(job[AJ_KT] + tid * dk * 4), (dk,), np.float32)
    scale = bits_f32(np.uint32(job[AJ_SCALE]))
    _attend(q, kc, vc, job[AJ_S], n_head, n_kv, dh, dv, scale, sc, kt, out, g0, g1)
    return 0


def attn_share_address() -> int:
    z = np.int64(0)
    return native_address(_attn_share, (z, z, z, z, z, z), ())
