"""The embedded default model (strata/data/default.gguf) is the trained one, and it behaves.

It is a qwen3moe trained on the Python standard library's source by scripts/train_tiny_moe.py
(strata/data/MODEL_CARD.md). On held-out text its perplexity in Strata is llama.cpp's; its
routing is far from uniform; `strata generate "def "` writes code; its greedy tokens are
llama.cpp's.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.constants import Keys

from strata.cli.common import DEFAULT_MODEL
from strata.cli.main import main
from strata.engine.engine import Engine
from strata.model.loader import load_model
from tests.oracle import plain_llama
from tests.test_llama_oracle import llama_greedy

HELDOUT = DEFAULT_MODEL.parent / "heldout.txt"  # the opening of a held-out stdlib module
N_HELDOUT = 384  # tokens scored: flips (see below) average out; ~10 s on two cores
PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Stack:\n    def push(self"]
DECISIVE = 3e-2  # as tests/test_llama_oracle.py: a top-1/top-2 margin above a rounding flip's


@pytest.fixture(scope="module")
def model():
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def heldout(model) -> list[int]:
    ids = model.tokenizer.encode(HELDOUT.read_text(), add_bos=True)
    assert len(ids) > N_HELDOUT
    return ids[:N_HELDOUT]


@pytest.fixture(scope="module")
def ours(model, heldout) -> tuple[np.ndarray, np.ndarray]:
    """Strata's logits [T, V] on the held-out tokens and the expert picks per layer [L, E]."""
    engine = Engine(model, n_ctx=512)
    logits = engine.forward(heldout, all_logits=True)
    return logits, engine.stats.expert_hist.copy()


def open_llama(llama_cpp, n_ctx=512):
    return plain_llama(
        llama_cpp,
        model_path=str(DEFAULT_MODEL),
        n_ctx=n_ctx,
        n_batch=n_ctx,
        logits_all=True,
        n_threads=2,
        flash_attn=False,
        verbose=False,
        seed=0,
    )


def perplexity(logits: np.ndarray, tokens: list[int]) -> float:
    """exp(mean NLL) of tokens[1:] under logits[:-1]."""
    z = logits[:-1].astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(tokens) - 1), tokens[1:]].mean()))


def load_stats(counts: np.ndarray) -> tuple[float, float]:
    """Normalized entropy of an expert-load histogram [E] and the share of its top 25%."""
    p = counts / counts.sum()
    nz = p[p > 0]
    entropy = float(-(nz * np.log(nz)).sum() / np.log(counts.size))
    top = np.sort(counts)[::-1][: counts.size // 4].sum() / counts.sum()
    return entropy, float(top)


def test_default_is_a_small_trained_qwen3moe(model):
    a = model.args
    assert a.arch == "qwen3moe" and a.n_expert >= 32 and a.n_expert_used >= 4
    assert DEFAULT_MODEL.stat().st_size <= 20_000_000
    assert model.metadata[Keys.General.NAME] == "strata-tiny-moe"
    assert model.metadata["strata.train.val_loss"] < 3.0  # nats/token; an untrained one: ~9


@pytest.mark.llama
def test_tokenizer_ids_equal_llama_cpp(llama_cpp, model):
    llm = llama_cpp.Llama(model_path=str(DEFAULT_MODEL), vocab_only=True, verbose=False)
    chat = "<|im_start|>user\nsort a list<|im_end|>\n<|im_start|>assistant\n<think>\n</think>"
    for text in [HELDOUT.read_text(), "def f(x):\n\treturn x  # café 中文 😀\r\n", chat]:
        theirs = llm.tokenize(text.encode(), add_bos=True, special=True)
        assert model.tokenizer.encode(text) == theirs


@pytest.mark.llama
def test_heldout_perplexity_equals_llama_cpp(llama_cpp, heldout, ours):
    """Within 0.5%. Logits agree to ~1e-7 until the first Q8 rounding flip or router near-tie,
    then by ~0.5% (llama.cpp differs from itself that much between batched and one-by-one
    evaluation of this model), so single tokens can differ: the mean over 383 is close."""
    llm = open_llama(llama_cpp)
    llm.eval(heldout)
    theirs = perplexity(np.array(llm.scores[: len(heldout)]), heldout)
    mine = perplexity(ours[0], heldout)
    print(f"held-out perplexity ({len(heldout)} tokens): strata {mine:.4f}, llama.cpp {theirs:.4f}")
    assert mine == pytest.approx(theirs, rel=5e-3)
    assert mine < 30  # a trained model: uniform over 8192 tokens would be 8192


def test_routing_is_far_from_uniform(model, ours):
    """Per layer, the load over the held-out tokens is far more concentrated than a uniform
    router's (its 99.9th percentile over 2000 simulated runs of the same size), yet no layer has
    collapsed onto a few experts."""
    hist = ours[1]  # [L, E] picks
    n_picks, n_exp = int(hist[0].sum()), hist.shape[1]
    rng = np.random.default_rng(0)
    uniform = rng.multinomial(n_picks, [1 / n_exp] * n_exp, size=2000)  # [2000, E]
    null = np.array([load_stats(c) for c in uniform])
    ent_lo, top_hi = np.quantile(null[:, 0], 0.001), np.quantile(null[:, 1], 0.999)
    print(f"uniform router: entropy >= {ent_lo:.3f}, top-25% share <= {top_hi:.3f}")
    for i, counts in enumerate(hist):
        entropy, top = load_stats(counts)
        print(f"layer {i}: entropy {entropy:.3f}, top-25% share {top:.3f}")
        assert entropy < ent_lo and top > top_hi + 0.05, f"layer {i} routes almost uniformly"
        assert entropy > 0.6 and (counts > 0).sum() >= n_exp // 2, f"layer {i} collapsed"


def test_generate_def_prints_code(capsys, monkeypatch):
    monkeypatch.delenv("STRATA_MODEL", raising=False)  # the embedded default
    assert main(["generate", "def ", "-n", "64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("def ")
    assert any(s in out[4:] for s in ("(", ":", "return", "self", "=")), out


@pytest.mark.llama
def test_greedy_tokens_equal_llama_cpp(llama_cpp, model):
    """32 greedy steps on 3 prompts. A trained model is decisive: all steps usually match. Where
    the two part, it must be at a step llama.cpp itself nearly tied, and teacher-forced on
    llama.cpp's tokens every decisive step must pick the same token."""
    llm = open_llama(llama_cpp, n_ctx=128)
    same = 0
    for prompt in PROMPTS:
        ids = model.tokenizer.encode(prompt)
        theirs, margins = llama_greedy(llm, ids, 32)
        engine = Engine(model, n_ctx=128)
        logits = engine.forward(ids)
        mine = []
        for _ in range(32):
            mine.append(int(np.argmax(logits)))
            logits = engine.forward([mine[-1]])
        k = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b), 32)
        same += k
        print(f"{prompt!r}: {k}/32 steps equal -> {model.tokenizer.decode(theirs)!r}")
        if k < 32:
            assert margins[k] < DECISIVE, f"{prompt!r}: step {k} differs at margin {margins[k]:.3g}"
        engine.reset()
        forced = engine.forward(ids + theirs[:-1], all_logits=True)[len(ids) - 1 :]  # [32, V]
        decisive = np.array(margins) >= DECISIVE
        assert (forced.argmax(-1) == np.array(theirs))[decisive].all(), prompt
    print(f"greedy: {same}/{32 * len(PROMPTS)} steps equal before any divergence")
