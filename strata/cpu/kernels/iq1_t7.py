"""IQ1_M repacked as 7-bit ternary quads ("T7"): 68 bytes per 256 weights (1.21x), byte permutes.

T2 (iq1_t2.py) spends 2 bits on each ternary weight: 64 code bytes a super-block, 1.36x the
GGUF bytes, and its kernel is then bound by those bytes. Four ternary values have 81 < 128
states, so a quad fits 7 bits: 56 code bytes, 1.21x. Quad j (0..63) of a super-block holds the
weights j, 64 + j, 128 + j and 192 + j as

    q_j = u_j + 3 u_{64+j} + 9 u_{128+j} + 27 u_{192+j}      (u = g + 1 in {0, 1, 2})

and the 64 quads are one little-endian bit stream, quad j in bits 7 j .. 7 j + 6. A row is three
planes (the delta and scale planes are T2's):

    [nb x 56: quads] [nb x 4: delta sign bits, bit k = group k of 8] [nb x 8: scale words]

The AVX-512 kernel (iq1_t7_avx512.py) decodes the 64 quads of a block with one byte permute
(7-byte groups into qwords), one vpmultishiftqb (each quad into its byte) and one vpermi2b
through `PACKED` (128 bytes: digit k of q in bits 2 k, 2 k + 1), then masks and one shift as T2:
digit vector k holds the codes of weights 64 k .. 64 k + 63 in natural order, against the
activation quants as they are.

Kernel arithmetic as T2's (integers times 8): per 16 weights with scale sc = 2 ls + 1,
8 sc sum(u x) + sum over its two groups of sc (delta_g - 8) X8_g. Lossless: `unpack` recovers
every 11-bit index (the iq1s grid is injective) and refuses quads above 80 or groups of 8 outside
the grid.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from strata.cpu.kernels.iq1 import iq1m_d
from strata.cpu.kernels.iq1_t2 import (
    BB_GGUF,
    UCODE,
    delta_term,
    gguf_blocks,
    gguf_codes,
    planes,
    sub_scale,
)
from strata.cpu.kernels.lut4 import _chunked

BB = 68  # bytes per super-block: 56 quads, 4 delta, 8 scale
P3 = 3 ** np.arange(4)  # the digit weights of a quad
# DIGITS[k][q] = digit k of q (q < 81; the rest 0); PACKED[q]: the four in bits 2 k, 2 k + 1
DIGITS = np.zeros((4, 128), np.uint8)
DIGITS[:, :81] = (np.arange(81)[None, :] // P3[:, None]) % 3
PACKED = (DIGITS << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(0).astype(np.uint8)


# ---------------------------------------------------------------- layout transform


def repack(w: np.ndarray) -> np.ndarray:
    """IQ1_M rows [R, nb * 56] -> T7 rows [R, nb * 68] (Numba, parallel over rows)."""
    w = np.ascontiguousarray(w).view(np.uint8)
    if w.ndim != 2 or w.shape[1] % BB_GGUF:
        raise ValueError(f"rows of {BB_GGUF}-byte blocks expected, got shape {w.shape}")
    out = np.empty((w.shape[0], w.shape[1] // BB_GGUF * BB), np.uint8)
    _repack_rows(w, out, UCODE)
    return out


@njit(cache=True, parallel=True)
def _repack_rows(w, out, ucode):
    nb = w.shape[1] // BB_GGUF
    for r in prange(w.shape[0]):
        u = np.empty(256, np.int64)  # the block's codes, natural order
        for b in range(nb):
            o = b * BB_GGUF
            delta = np.uint32(0)
            for k in range(32):  # group of 8 weights 8k..8k+7
                nib = (w[r, o + 32 + k // 2] >> (4 * (k & 1))) & 15
                idx = np.int32(w[r, o + k]) | (np.int32(nib & 7) << 8)
                delta |= np.uint32((nib >> 3) & 1) << k
                for e in range(8):
                    u[8 * k + e] = ucode[idx, e]
            for L in range(8):  # quads 8 L .. 8 L + 7: 56 bits, bytes 7 L .. 7 L + 6
                q = 0
                for t in range(8):
                    j = 8 * L + t
                    q |= (u[j] + 3 * u[64 + j] + 9 * u[128 + j] + 27 * u[192 + j]) << (7 * t)
                for t in range(7):
                    out[r, 56 * b + 7 * L + t] = (q >> (8 * t)) & 255
            for k in range(4):
                out[r, 56 * nb + 4 * b + k] = (delta >> (8 * k)) & 255
            for k in range(8):
                out[r, 60 * nb + 8 * b + k] = w[r, o + 48 + k]


@_chunked
def repack_reference(w: np.ndarray) -> np.ndarray:
    """IQ1_M rows [R, nb * 56] -> T7 rows [R, nb * 68]: the NumPy statement of `repack`."""
    u, delta, scales = gguf_codes(w)
    n, nb = delta.shape
    q = (u.reshape(n, nb, 4, 64).astype(np.int64) * P3[:, None]).sum(axis=2)  # [n, nb, 64]
    bits = ((q[..., None] >> np.arange(7)) & 1).astype(np.uint8).reshape(n, nb, 448)
    quads = np.packbits(bits, axis=-1, bitorder="little")  # [n, nb, 56]
    return planes(quads.reshape(n, -1), delta, scales)


@_chunked
def unpack(p: np.ndarray) -> np.ndarray:
    """T7 rows [R, nb * 68] -> the IQ1_M bytes they came from."""
    n = p.shape[0]
    nb = p.shape[1] // BB
    quads = np.ascontiguousarray(p[:, : 56 * nb]).reshape(n, nb, 56)
    bits = np.unpackbits(quads, axis=-1, bitorder="little").reshape(n, nb, 64, 7)
    q = (bits.astype(np.int64) << np.arange(7)).sum(-1)  # [n, nb, 64]
    if (q > 80).any():
        raise ValueError("T7 quads above 80 are not four ternary digits")
    u = ((q[:, :, None, :] // P3[:, None]) % 3).reshape(n, nb, 256)  # weight 64 k + j
    return gguf_blocks(u, p[:, 56 * nb : 60 * nb], p[:, 60 * nb :], "T7 quads")


# ---------------------------------------------------------------- kernel


@njit(cache=True)
def dot_t7_portable(w, r, xq, xd, xb, x8, xf, a):
    """The T7 layout in plain @njit (fallback and oracle of the AVX-512 kernel)."""
    nb = w.shape[1] // BB
    acc = np.float32(0.0)
    for b in range(nb):
        so = 60 * nb + 8 * b
        do = 56 * nb + 4 * b
        isum = 0
        for s in range(16):  # weights 16 s ..: digit k = s // 4 of quads j0 .. j0 + 15
            p3 = 3 ** (s // 4)
            j0 = 16 * (s % 4)
            t = 0
            for j in range(j0, j0 + 16):
                lo = 56 * b + (7 * j) // 8  # (its next byte lies in the row: the planes follow)
                pair = np.int32(w[r, lo]) | (np.int32(w[r, lo + 1]) << 8)
                u = (((pair >> ((7 * j) % 8)) & 127) // p3) % 3
                t += u * xq[a, 256 * b + 16 * s + j - j0]
            isum += sub_scale(w, r, so, s) * (8 * t + delta_term(w, r, do, s, x8, a, 32 * b))
        d = iq1m_d(w, r, so - 48)
        acc += np.float32(xd[a, b] * d) * np.float32(isum) * np.float32(0.125)
    return acc
