"""quant_blocks.cuh sign_masks, host side, for every sign byte: the two multiplies put sign k at
bit 8k + 7 with no carry (7-bit copies 7 apart), and the byte fill (PTX prmt's sign mode on CUDA,
the shift-and-multiply fallback elsewhere) gives 0xFF exactly in the negative bytes; with the
parity (apply_signs7p) the signs are gguf's ksigns_iq2xs. The card runs the prmt form in the
GPU kernel tests; CI's emulated subset runs the fallback."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq

M32 = 0xFFFFFFFF


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): selector nibble bit 3 replicates the chosen byte's bit 7."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for k in range(4):
        nib = (sel >> (4 * k)) & 0xF
        byte = src[nib & 7]
        out |= ((0xFF if byte & 0x80 else 0) if nib & 8 else byte) << (8 * k)
    return out


def _masks(s7: int, s8hi: int, device: bool) -> tuple[int, int]:
    v = s7 & 0x7F
    h0, h1 = (v * 0x10204080) & M32, (v * 0x01020408) & M32
    if device:
        return _prmt(h0, 0, 0xBA98), _prmt(h1, s8hi, 0xCA98)
    m0 = (((h0 >> 7) & 0x01010101) * 0xFF) & M32
    m1 = ((((h1 >> 7) & 0x00010101) | ((s8hi << 17) & 0x01000000)) * 0xFF) & M32
    return m0, m1


def _expected(s8: int) -> tuple[int, int]:
    m = [0xFF if (s8 >> k) & 1 else 0 for k in range(8)]
    return (sum(m[k] << (8 * k) for k in range(4)), sum(m[4 + k] << (8 * k) for k in range(4)))


@pytest.mark.parametrize("device", [True, False], ids=["prmt", "fallback"])
def test_sign_masks_of_every_sign_byte(device):
    for s in range(256):
        junk = np.random.default_rng(s).integers(0, 1 << 24) << 8  # bits above the signs
        assert _masks(s | junk, s, device) == _expected(s), s


@pytest.mark.parametrize("device", [True, False], ids=["prmt", "fallback"])
def test_sign_masks_with_parity_are_ksigns(device):
    ksigns = np.frombuffer(gq.IQ2_XXS.ksigns, np.uint8)
    for s7 in range(128):
        par = bin(s7).count("1")
        for field in (s7, s7 | 0x80, s7 | 0xFFFF80):  # callers pass the word shifted, unmasked
            assert _masks(field, (par << 7) & M32, device) == _expected(int(ksigns[s7])), s7


def test_the_kernels_use_these_constants():
    """The multipliers, selectors and fallback masks above are quant_blocks.cuh sign_masks'."""
    from strata.gpu.source import expand

    src = expand("gemv.cu")
    body = src[src.index("void sign_masks(") :]
    body = body[: body.index("\n}\n")]
    for text in ("v * 0x10204080u", "v * 0x01020408u", "0xBA98", "0xCA98 + (KB << 12)",
                 "((h0 >> 7) & 0x01010101u) * 0xFFu", "((h1 >> 7) & 0x00010101u)",
                 "<< 17) & 0x01000000u"):  # fmt: skip
        assert text in body, text


def test_negation_by_the_masks_has_no_carries():
    g = np.random.default_rng(1)
    for _ in range(2000):
        vals = g.integers(1, 128, 4)
        s = int(g.integers(0, 16))
        word = int(sum(int(v) << (8 * k) for k, v in enumerate(vals)))
        m, _ = _expected(s)
        w = ((word ^ m) + (m & 0x01010101)) & M32
        got = np.frombuffer(w.to_bytes(4, "little"), np.int8)
        want = [-int(v) if (s >> k) & 1 else int(v) for k, v in enumerate(vals)]
        assert got.tolist() == want
