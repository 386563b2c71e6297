"""Strata against llama.cpp (llama-cpp-python) on the same synthetic GGUF files.

The reference forward with llama numerics must give llama.cpp's logits to 1e-4 relative; the
engine's greedy tokens must be llama.cpp's greedy tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.engine.engine import Engine
from strata.model.loader import load_model
from strata.model.reference import Reference
from tests.oracle import (
    FLIP_BOUND,
    assert_logits_match,
    float_matmuls_copied,
    near_tie_onward,
    plain_llama,
    position_errors,
    simd_lanes,
)

pytestmark = pytest.mark.llama

# (expert quant, dense quant): every expert format the issue names, with a few dense mixes
MIXES = [
    ("Q8_0", "Q8_0"),
    ("Q4_K", "Q8_0"),
    ("Q6_K", "Q4_K"),
    ("IQ3_XXS", "Q8_0"),
    ("IQ3_S", "Q6_K"),
    ("IQ1_M", "Q8_0"),
    ("IQ2_XXS", "F16"),
    ("IQ4_XS", "Q5_K"),
    ("Q5_K", "BF16"),
    ("IQ2_S", "F32"),
    ("MXFP4", "Q8_0"),
]


def llama_logits(llm, tokens) -> np.ndarray:
    """llama.cpp's logits for every position of `tokens` [T, V]."""
    llm.reset()
    llm.eval(list(tokens))
    return np.array(llm.scores[: len(tokens)], dtype=np.float64)


def open_llama(llama_cpp, path, n_ctx=256):
    return plain_llama(
        llama_cpp,
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=n_ctx,
        logits_all=True,
        n_threads=2,
        flash_attn=False,
        verbose=False,
        seed=0,
    )


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("quant,dense", MIXES)
def test_reference_logits_match_llama_cpp(llama_cpp, synth_model, quant, dense):
    rng = np.random.default_rng()
    path = synth_model("tiny", quant, dense=dense, seed=int(rng.integers(1000)))
    model = load_model(path)
    llm = open_llama(llama_cpp, path)
    llama_ref = Reference(model, "llama", lanes=simd_lanes(llama_cpp))
    exact_ref = Reference(model, "exact")
    errs, exact_errs, tied = [], [], []
    for _ in range(16):  # short sequences: a rounding flip spoils only the rest of its own
        tokens = rng.integers(0, model.args.n_vocab, size=4).tolist()
        theirs = llama_logits(llm, tokens)  # [T, V]
        assert np.abs(theirs).max() > 1.0
        margins: list[np.ndarray] = []
        errs.append(position_errors(llama_ref.forward(tokens, margins=margins), theirs))
        tied.append(near_tie_onward(margins))
        exact_errs.append(position_errors(exact_ref.forward(tokens), theirs))
    assert_logits_match(np.concatenate(errs), 1e-4, apart=np.concatenate(tied))
    # without the roundings almost no position gets there: the comparison is sensitive
    assert (np.concatenate(exact_errs) <= 1e-4).mean() < 0.2


@pytest.mark.parametrize("dense", ["F16", "BF16", "F32"])
def test_first_positions_match_llama_cpp_with_float_dense_weights(llama_cpp, synth_model, dense):
    """llama.cpp sums F16/BF16/F32 matmuls in float32 (llamafile's tinyBLAS); that noise (~1e-7)
    flips the f16 roundings after it (the next matmul's input, the f16 V cache) and a flip reaches
    the Q8_K roundings of the experts, 1e-3 of the logits. The reference copies that arithmetic,
    so a sequence's first position (nothing earlier to inherit a flip from) agrees to 1e-4 in
    nearly every sequence: over 4 x 192 sequences 1-3 % did not (F16), 0-1 % (F32), 0.5-1.6 %
    (BF16), against 8-15 % (F16) in float64. With F16/BF16 weights most are bit-exact: the f16
    rounding before the output matmul absorbs the experts' float64-vs-float32 noise."""
    if not float_matmuls_copied(llama_cpp):
        pytest.skip("the reference copies llama.cpp's float32 matmul order on x86 AVX2 only")
    rng = np.random.default_rng()
    path = synth_model("tiny", "IQ2_XXS", dense=dense, seed=int(rng.integers(1000)))
    model = load_model(path)
    llm = open_llama(llama_cpp, path)
    ref = Reference(model, "llama", lanes=simd_lanes(llama_cpp))
    first = []
    for _ in range(192):
        tokens = rng.integers(0, model.args.n_vocab, size=2).tolist()  # T >= 2: tinyBLAS
        first.append(position_errors(ref.forward(tokens), llama_logits(llm, tokens))[0])
    first = np.array(first)
    assert (first > 1e-4).mean() <= 0.08, np.sort(first)[::-1][:12]
    if dense != "F32":  # measured 80-87 % (F16), 96-99 % (BF16); 0 % in float64
        assert (first == 0).mean() >= 0.5, np.sort(first)[::-1][:12]


def llama_greedy(llm, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """llama.cpp's greedy tokens and, per step, its top-1/top-2 margin over max |logit|."""
    llm.reset()
    llm.eval(prompt)
    out, margins = [], []
    for _ in range(n):
        z = np.array(llm.scores[llm.n_tokens - 1])
        top2 = np.sort(z)[-2:]
        margins.append(float((top2[1] - top2[0]) / np.abs(z).max()))
        out.append(int(np.argmax(z)))
        llm.eval([out[-1]])
    return out, margins


DECISIVE = 3e-2  # a margin above what a rounding flip's cascade moves the logits (tests/oracle.py)


@pytest.mark.parametrize("quant", ["IQ3_XXS", "Q4_K", "MXFP4"])
def test_engine_greedy_tokens_equal_llama_cpp(llama_cpp, synth_model, quant):
    """32 greedy steps on 3 prompts: our tokens are llama.cpp's. Where they part, it is at a step
    llama.cpp itself nearly tied (margin under a rounding flip's reach: random synthetic models
    have many such steps); teacher-forced on llama.cpp's tokens, every decisive step picks the
    same token."""
    path = synth_model("tiny", quant, seed=7)
    model = load_model(path)
    tok = model.tokenizer
    llm = open_llama(llama_cpp, path)
    for prompt in ["def fibonacci(n):", "The capital of France is", "Once upon a time, 1 2 3"]:
        ids = tok.encode(prompt)
        theirs, margins = llama_greedy(llm, ids, 32)
        engine = Engine(model, n_ctx=256)
        logits = engine.forward(ids)
        ours = []
        for _ in range(32):
            ours.append(int(np.argmax(logits)))
            logits = engine.forward([ours[-1]])
        k = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), 32)
        if k < 32:
            assert margins[k] < DECISIVE, f"{prompt!r}: step {k} differs at margin {margins[k]:.3g}"
        engine.reset()
        forced = engine.forward(ids + theirs[:-1], all_logits=True)[len(ids) - 1 :]  # [32, V]
        decisive = np.array(margins) >= DECISIVE
        assert decisive.mean() > 0.5
        assert (forced.argmax(-1) == np.array(theirs))[decisive].all(), prompt


# ---- gpt-oss: sinks, a sliding window of 8, biases, YaRN, the clamped SwiGLU ----


FLIP_CASCADE = 0.05  # what flips carry through a sequence of 24 (~1e-2); the window moves 0.1-0.8


@pytest.mark.parametrize(
    "quant,dense", [("MXFP4", "Q8_0"), ("Q8_0", "Q8_0"), ("Q4_K", "Q8_0"), ("IQ4_XS", "F16")]
)
def test_gpt_oss_reference_logits_match_llama_cpp(llama_cpp, synth_model, quant, dense):
    """Short sequences with a window of 4 (7 tokens, 3 past it; many sequences, so that flips
    stay rare): the reference's llama numerics give llama.cpp's logits to 1e-4. Sequences of 24
    with the window of 8: every position (before a router near tie) within what flips carry,
    while a window off by one would move the logits past it by 0.1-0.8."""
    rng = np.random.default_rng()
    seed = int(rng.integers(1000))
    for window, size, n in ((4, 7, 16), (8, 24, 4)):
        path = synth_model("tiny-gpt-oss", quant, dense=dense, seed=seed, sliding_window=window)
        model = load_model(path)
        llm = open_llama(llama_cpp, path)
        llama_ref = Reference(model, "llama", lanes=simd_lanes(llama_cpp))
        exact_ref = Reference(model, "exact")
        errs, exact_errs, tied = [], [], []
        for _ in range(n):
            tokens = rng.integers(0, model.args.n_vocab, size=size).tolist()
            theirs = llama_logits(llm, tokens)  # [T, V]
            assert np.abs(theirs).max() > 1.0
            margins: list[np.ndarray] = []
            errs.append(position_errors(llama_ref.forward(tokens, margins=margins), theirs))
            tied.append(near_tie_onward(margins))
            exact_errs.append(position_errors(exact_ref.forward(tokens), theirs))
        errs, tied = np.concatenate(errs), np.concatenate(tied)
        if size < 8:
            assert_logits_match(errs, 1e-4, apart=tied)
            assert (np.concatenate(exact_errs) <= 1e-4).mean() < 0.2
        else:
            assert errs[~tied].max(initial=0) <= FLIP_CASCADE, np.sort(errs[~tied])[::-1][:8]


@pytest.mark.parametrize("quant", ["MXFP4", "Q4_K"])
def test_gpt_oss_engine_greedy_tokens_equal_llama_cpp(llama_cpp, synth_model, quant):
    """The CPU-only engine's greedy tokens are llama.cpp's past the sliding window (prompt +
    32 steps > 8), with llama.cpp's near ties excepted as for qwen3moe; MXFP4 is gpt-oss's own
    expert format."""
    path = synth_model("tiny-gpt-oss", quant, seed=7)
    model = load_model(path)
    tok = model.tokenizer
    llm = open_llama(llama_cpp, path)
    for prompt in ["def fibonacci(n):", "The capital of France is"]:
        ids = tok.encode(prompt)
        theirs, margins = llama_greedy(llm, ids, 32)
        engine = Engine(model, n_ctx=256)
        logits = engine.forward(ids)
        ours = []
        for _ in range(32):
            ours.append(int(np.argmax(logits)))
            logits = engine.forward([ours[-1]])
        k = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), 32)
        if k < 32:
            assert margins[k] < DECISIVE, f"{prompt!r}: step {k} differs at margin {margins[k]:.3g}"
        engine.reset()
        forced = engine.forward(ids + theirs[:-1], all_logits=True)[len(ids) - 1 :]  # [32, V]
        decisive = np.array(margins) >= DECISIVE
        assert decisive.mean() > 0.5
        assert (forced.argmax(-1) == np.array(theirs))[decisive].all(), prompt


def test_gpt_oss_120b_shaped_layer_loads_in_llama_cpp_and_matches(llama_cpp, synth_model):
    """The real dimensions (D 2880, 64 heads of 64, 8 KV heads, a window of 128, YaRN over 4096)
    in two layers of 4 Q8_0 experts: llama.cpp loads the file and the reference gives its
    logits. At this width a Q8 flip is common even at a sequence's first position (~1 in 6 here,
    as at qwen3moe's real width; with MXFP4 experts ~6 in 8, so the tiny-gpt-oss tests hold
    MXFP4 to llama.cpp instead), so the statement is the oracle's: first positions agree to
    1e-4 often (a quarter at least), none is off by more than a flip, and the greedy picks
    agree."""
    path = synth_model("gpt-oss-120b", "Q8_0", seed=2, n_layer=2, n_expert=4, n_vocab=1024)
    model = load_model(path)
    assert (model.args.n_embd, model.args.n_head, model.args.window(0)) == (2880, 64, 128)
    llm = open_llama(llama_cpp, path)
    ref = Reference(model, "llama", lanes=simd_lanes(llama_cpp))
    seed = int(np.random.SeedSequence().entropy % 2**32)  # fresh, named when it fails
    rng = np.random.default_rng(seed)
    errs, agree = [], []
    for _ in range(12):
        tokens = rng.integers(0, model.args.n_vocab, size=3).tolist()
        theirs = llama_logits(llm, tokens)
        ours = ref.forward(tokens)
        errs.append(position_errors(ours, theirs))
        agree.append(ours.argmax(-1) == theirs.argmax(-1))
    errs = np.stack(errs)  # [12, 3]
    # some sequences' first positions flip more often than 1 in 6 (one seen: 6 of 8)
    assert (errs[:, 0] <= 1e-4).mean() >= 0.25 and errs.max() <= FLIP_BOUND, (seed, errs)
    assert np.mean(agree) >= 0.8, seed
