"""The CPU-only decode step (strata/engine/steps/host.py): one compiled call a token gives the
logits of the layer-by-layer host path to float noise, and the embedded model's greedy tokens
unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from strata.build import build_engine
from strata.config import resolve
from strata.model.loader import load_model
from tests.oracle import assert_logits_match, position_errors

ALL_CPU = {"expert_cache": "0", "car_threshold": 1.0, "device": "host", "n_ctx": 96}


def _engine(path):
    eng = build_engine(load_model(path), resolve(dict(ALL_CPU), env={}))
    assert eng.host_step is not None
    return eng


@pytest.mark.parametrize("quant,dense", [("IQ3_XXS", "Q6_K"), ("Q4_K", "Q8_0"), ("IQ4_XS", "F16")])
def test_step_logits_match_the_layer_by_layer_path(synth_model, quant, dense):
    eng = _engine(synth_model("tiny", quant, dense=dense, seed=5))
    step = eng.host_step
    rng = np.random.default_rng()
    prompt = rng.integers(0, eng.args.n_vocab, 9).tolist()
    eng.forward(prompt)
    ours, theirs = [], []
    tok = int(rng.integers(0, eng.args.n_vocab))
    for _ in range(24):  # both from the same cache: the eager token, then the step's over it
        pos = eng.pos
        eng.host_step = None
        theirs.append(eng.forward([tok]))
        eng.reset(pos)
        eng.host_step = step
        ours.append(eng.forward([tok]))
        tok = int(np.argmax(theirs[-1]))
    assert_logits_match(position_errors(np.stack(ours), np.stack(theirs)), 1e-5, min_frac=0.8)
    assert eng.stats.decode_steps == 48 and eng.stats.misses > 0


def test_step_keeps_the_embedded_models_greedy_tokens():
    from strata.cli.common import DEFAULT_MODEL

    eng = _engine(DEFAULT_MODEL)
    prompt = eng.model.tokenizer.encode("def fibonacci(n):")
    runs = []
    for host_step in (eng.host_step, None):
        eng.host_step = host_step
        eng.reset()
        tok = int(np.argmax(eng.forward(prompt)))
        toks = [tok]
        for _ in range(32):
            tok = eng.decode_greedy(tok)
            toks.append(tok)
        runs.append(toks)
    assert runs[0] == runs[1]


def test_no_step_where_an_expert_is_resident(synth_model):
    cfg = resolve({**ALL_CPU, "expert_cache": "4"}, env={})
    eng = build_engine(load_model(synth_model("tiny", "Q4_K")), cfg)
    assert eng.host_step is None


def test_step_compiles_dense_once_for_every_matrix(monkeypatch):
    """`_decode` passes its matrix ranges as int64, not as constants: a constant types as a
    literal, and Numba would compile `_dense` once per call site (four, ~7 s of a cold start).
    A fresh `_decode` (not from the cache) types its calls again."""
    import numba
    from numba import types

    from strata.cli.common import DEFAULT_MODEL
    from strata.engine.steps import host

    eng = _engine(DEFAULT_MODEL)
    tok = int(np.argmax(eng.forward(eng.model.tokenizer.encode("def fibonacci(n):"))))
    monkeypatch.setattr(host, "_decode", numba.njit(nogil=True)(host._decode.py_func))
    eng.decode_greedy(tok)
    sigs = host._dense.signatures
    assert len(sigs) == 1 and not any(isinstance(t, types.Literal) for t in sigs[0]), sigs
