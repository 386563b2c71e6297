"""The NextN (MTP) block of qwen3next against llama.cpp's MTP context (LLAMA_CONTEXT_TYPE_MTP,
llama_model_params.load_mtp): the same hidden rows h and next tokens in, the same draft logits
out. llama.cpp takes h as the batch's `embd` beside its `token` (the MTP hook batch; the
batch_ext setter for it is a TODO in 0.3.36), so the test builds that llama_batch by hand."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from strata.model.loader import load_model
from strata.model.reference import Reference
from strata.model.reference_hybrid import forward_nextn, trunk_hidden
from tests.oracle import position_errors, simd_lanes

pytestmark = pytest.mark.llama


def llama_mtp_logits(llama_cpp, path, h: np.ndarray, tokens: list[int]) -> np.ndarray:
    """llama.cpp's MTP logits [T, V] for hidden rows h [T, D] and tokens [T] at positions 0..T-1
    (flash attention off: the reference copies the plain attention's f16 roundings)."""
    lib = llama_cpp.llama_cpp
    lib.llama_backend_init()
    mp = lib.llama_model_default_params()
    mp.load_mtp = True
    model = lib.llama_model_load_from_file(str(path).encode(), mp)
    assert model and lib.llama_model_n_layer_nextn(model) == 1
    cp = lib.llama_context_default_params()
    cp.ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 64
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = lib.llama_init_from_model(model, cp)
    try:
        t = len(tokens)
        tok = (ctypes.c_int32 * t)(*tokens)
        emb = np.ascontiguousarray(h, np.float32)
        pos = (ctypes.c_int32 * t)(*range(t))
        n_seq = (ctypes.c_int32 * t)(*([1] * t))
        seq0 = [(ctypes.c_int32 * 1)(0) for _ in range(t)]
        seq = (ctypes.POINTER(ctypes.c_int32) * t)(
            *[ctypes.cast(s, ctypes.POINTER(ctypes.c_int32)) for s in seq0]
        )
        out = (ctypes.c_int8 * t)(*([1] * t))
        b = lib.llama_batch()
        b.n_tokens = t
        b.token = ctypes.cast(tok, type(b.token))
        b.embd = emb.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        b.pos = ctypes.cast(pos, type(b.pos))
        b.n_seq_id = ctypes.cast(n_seq, type(b.n_seq_id))
        b.seq_id = ctypes.cast(seq, type(b.seq_id))
        b.logits = ctypes.cast(out, type(b.logits))
        assert lib.llama_decode(ctx, b) == 0
        n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
        rows = [
            np.ctypeslib.as_array(lib.llama_get_logits_ith(ctx, j), shape=(n_vocab,))
            for j in range(t)
        ]
        return np.array(rows, np.float64)
    finally:
        lib.llama_free(ctx)
        lib.llama_model_free(model)


@pytest.mark.parametrize("quant,dense", [("Q4_K", "Q8_0"), ("IQ3_XXS", "Q6_K")])
def test_nextn_block_logits_match_llama_cpp(llama_cpp, synth_model, quant, dense):
    """The draft logits agree to 1e-4 except where a Q8 rounding flips (measured: 29 of 30
    positions at 0.5-2e-7, one at 5e-3)."""
    path = synth_model("tiny-qwen3next", quant, dense=dense, seed=31)
    model = load_model(path)
    ref = Reference(model, "llama", lanes=simd_lanes(llama_cpp))
    rng = np.random.default_rng(31)
    errs = []
    for _ in range(3):
        toks = rng.integers(0, model.args.n_vocab, size=5).tolist()
        h = trunk_hidden(ref, toks)  # [T, D], the trunk's output-normed rows
        nxt = toks[1:] + [int(rng.integers(model.args.n_vocab))]
        theirs = llama_mtp_logits(llama_cpp, path, h, nxt)
        ours = forward_nextn(ref, h.astype(np.float32).astype(np.float64), nxt, np.arange(5))
        errs.append(position_errors(ours, theirs))
    errs = np.concatenate(errs)
    assert (errs <= 1e-4).mean() >= 0.6 and errs.max() < 0.15, errs
