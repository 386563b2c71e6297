"""qwen3next and qwen35moe against llama.cpp (llama-cpp-python) on the same synthetic GGUF
(tiny-qwen3next / tiny-qwen35moe: 3 gated DeltaNet layers, 1 gated attention layer, MoE with a
shared expert, a NextN block).

The reference copies llama.cpp's roundings (tests/oracle.py): on a first position without a
rounding flip its logits are llama.cpp's bit for bit (measured 0 error with F32, Q8_0 and Q4_K
weights). A flipped Q8 rounding moves the logits ~1e-2 of their range here and, through the
DeltaNet state as through attention, every later position: so the statements are the oracle's,
over short sequences (most positions within 1e-4, none beyond a flip).
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.engine.engine import Engine
from strata.model.loader import load_model
from strata.model.reference import Reference
from tests.oracle import assert_logits_match, near_tie_onward, position_errors, simd_lanes
from tests.test_llama_oracle import DECISIVE, llama_greedy, llama_logits, open_llama

pytestmark = pytest.mark.llama

MIXES = [
    ("tiny-qwen3next", "Q4_K", "Q8_0"),
    ("tiny-qwen3next", "IQ3_XXS", "Q8_0"),
    ("tiny-qwen3next", "Q8_0", "Q6_K"),
    ("tiny-qwen35moe", "Q4_K", "Q8_0"),
    ("tiny-qwen35moe", "IQ2_XXS", "Q5_K"),
]


@pytest.mark.parametrize("shape,quant,dense", MIXES)
def test_reference_logits_match_llama_cpp(llama_cpp, synth_model, shape, quant, dense):
    rng = np.random.default_rng()
    path = synth_model(shape, quant, dense=dense, seed=int(rng.integers(1000)))
    model = load_model(path)
    llm = open_llama(llama_cpp, path)
    ref = Reference(model, "llama", lanes=simd_lanes(llama_cpp))
    exact = Reference(model, "exact")
    errs, tied, exact_errs = [], [], []
    for _ in range(12):
        tokens = rng.integers(0, model.args.n_vocab, size=4).tolist()
        theirs = llama_logits(llm, tokens)  # [T, V]
        assert np.abs(theirs).max() > 1.0
        margins: list[np.ndarray] = []
        errs.append(position_errors(ref.forward(tokens, margins=margins), theirs))
        tied.append(near_tie_onward(margins))
        exact_errs.append(position_errors(exact.forward(tokens), theirs))
    # measured: 100 % of positions within 1e-4 (worst ~1.2e-7) with Q4_K / IQ3_XXS experts and
    # Q8_0 dense weights; 81 % (worst 0.034, flips) with Q8_0 experts and Q6_K dense
    assert_logits_match(np.concatenate(errs), 1e-4, apart=np.concatenate(tied))
    # without the roundings no position gets there (float64 throughout: ~0.2 worst)
    assert (np.concatenate(exact_errs) <= 1e-4).mean() < 0.2


@pytest.mark.parametrize(
    "shape,quant",
    [("tiny-qwen3next", "Q4_K"), ("tiny-qwen3next", "IQ3_XXS"), ("tiny-qwen35moe", "Q4_K")],
)
def test_engine_greedy_tokens_equal_llama_cpp(llama_cpp, synth_model, shape, quant):
    """24 greedy steps on 2 prompts on the CPU-only tier: our tokens are llama.cpp's, except
    from a step llama.cpp itself nearly tied; teacher-forced on llama.cpp's tokens every
    decisive step picks the same token."""
    path = synth_model(shape, quant, seed=7)
    model = load_model(path)
    tok = model.tokenizer
    llm = open_llama(llama_cpp, path)
    n = 24
    for prompt in ["def fibonacci(n):", "Once upon a time, 1 2 3"]:
        ids = tok.encode(prompt)
        theirs, margins = llama_greedy(llm, ids, n)
        engine = Engine(model, n_ctx=128)
        logits = engine.forward(ids)
        ours = []
        for _ in range(n):
            ours.append(int(np.argmax(logits)))
            logits = engine.forward([ours[-1]])
        k = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), n)
        if k < n:
            assert margins[k] < DECISIVE, f"{prompt!r}: step {k} differs at margin {margins[k]:.3g}"
        engine.reset()
        forced = engine.forward(ids + theirs[:-1], all_logits=True)[len(ids) - 1 :]  # [n, V]
        decisive = np.array(margins) >= DECISIVE
        assert decisive.mean() > 0.5
        assert (forced.argmax(-1) == np.array(theirs))[decisive].all(), prompt


def test_cpu_pool_engine_greedy_tokens_equal_llama_cpp(llama_cpp, synth_model):
    """What `strata generate --device host` builds (dense matrices on the pool's kernels, every
    expert in the CPU pool, the eager host step): llama.cpp's greedy tokens up to its own
    near-ties, and every decisive teacher-forced step the same."""
    from strata.build import build_engine
    from strata.config import EngineConfig

    path = synth_model("tiny-qwen3next", "IQ3_XXS", seed=5)
    model = load_model(path)
    engine = build_engine(model, EngineConfig(device="host", threads=2, n_ctx=128))
    assert type(engine.tier).__name__ == "HybridHostTier" and engine.host_step is None
    llm = open_llama(llama_cpp, path)
    ids = model.tokenizer.encode("The capital of France is")
    n = 16
    theirs, margins = llama_greedy(llm, ids, n)
    tok = int(np.argmax(engine.forward(ids)))
    ours = [tok]
    for _ in range(n - 1):
        tok = engine.decode_greedy(tok)
        ours.append(tok)
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), n)
    if k < n:
        assert margins[k] < DECISIVE, f"step {k} differs at margin {margins[k]:.3g}"
    engine.reset()
    forced = engine.forward(ids + theirs[:-1], all_logits=True)[len(ids) - 1 :]  # [n, V]
    decisive = np.array(margins) >= DECISIVE
    assert (forced.argmax(-1) == np.array(theirs))[decisive].all()


def test_legacy_ssm_in_file_matches_llama_cpp(llama_cpp, synth_model, tmp_path):
    """llama.cpp's legacy path (ssm_in, per key head [q, k, v, z]) and ours read the same file
    the same way."""
    from tests.test_qwen3next import legacy_copy

    split = synth_model("tiny-qwen3next", "Q4_K", seed=21)
    path = tmp_path / "legacy.gguf"
    legacy_copy(split, path, load_model(split).args)
    model = load_model(path)
    llm = open_llama(llama_cpp, path)
    ref = Reference(model, "llama", lanes=simd_lanes(llama_cpp))
    rng = np.random.default_rng(21)
    errs, tied = [], []
    for _ in range(6):
        tokens = rng.integers(0, model.args.n_vocab, size=4).tolist()
        margins: list[np.ndarray] = []
        errs.append(
            position_errors(ref.forward(tokens, margins=margins), llama_logits(llm, tokens))
        )
        tied.append(near_tie_onward(margins))
    assert_logits_match(np.concatenate(errs), 1e-4, apart=np.concatenate(tied))
