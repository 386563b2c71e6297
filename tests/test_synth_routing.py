"""`strata synth --routing-entropy H`: the routers of a synthetic model solved so that expert
usage over random tokens has normalized entropy H per layer, with prompt distributions (halves of
the vocabulary) that route differently."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from strata.engine.engine import Engine
from strata.engine.synth_routing import write_routed
from strata.model.loader import load_model
from strata.model.synth import SynthSpec, make_args, topic_range
from strata.quant import fmt
from strata.routing.profile import usage_entropy

SHAPE = dict(n_expert=32, n_expert_used=4, n_layer=3)


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    """target -> (model path, calibration entropies) for a tiny routed model."""
    out = {}

    def make(target: float):
        if target not in out:
            spec = SynthSpec(
                make_args("tiny", **SHAPE), fmt("Q4_K").qtype, seed=5, routing_entropy=target
            )
            path = tmp_path_factory.mktemp("routed") / f"h{target}.gguf"
            paths, ent = write_routed(path, spec, progress=False)
            out[target] = (paths[0], ent)
        return out[target]

    return make


def _usage(path, lo: int | None = None, hi: int | None = None, seed: int = 11) -> np.ndarray:
    """Per-layer pick counts [L, E] of one prompt of 512 random tokens in [lo, hi)."""
    model = load_model(path)
    a = model.args
    eng = Engine(model, n_ctx=512)
    ids = np.random.default_rng(seed).integers(lo or 0, hi or a.n_vocab, 512)
    eng.forward(ids.tolist())
    return eng.stats.expert_hist


@pytest.mark.parametrize("target", [0.93, 0.97])
def test_usage_over_random_tokens_has_the_asked_entropy_in_every_layer(routed, target):
    path, calibration = routed(target)
    assert np.allclose(calibration, target, atol=0.005)
    measured = [usage_entropy(h) for h in _usage(path)]  # another prompt than the calibration's
    assert len(measured) == SHAPE["n_layer"]
    assert abs(np.mean(measured) - target) < 0.01, measured
    assert np.allclose(measured, target, atol=0.02), measured


def test_lower_entropy_concentrates_picks_on_fewer_experts(routed):
    def top_share(target):
        h = np.sort(_usage(routed(target)[0]), axis=1)[:, ::-1]
        return (h[:, :8].sum(1) / h.sum(1)).mean()

    assert top_share(0.93) > top_share(0.97) + 0.03


def test_the_two_halves_of_the_vocabulary_route_to_different_experts(routed):
    path, _ = routed(0.93)
    n_vocab = load_model(path).args.n_vocab
    first, second = (_usage(path, *topic_range(n_vocab, t)) for t in (0, 1))
    for a, b in zip(first, second, strict=True):
        top_a, top_b = set(np.argsort(-a)[:8]), set(np.argsort(-b)[:8])
        assert len(top_a & top_b) <= 4  # each half's popular experts are mostly its own
        assert usage_entropy(a) < 0.93 and usage_entropy(b) < 0.93  # a half is narrower


def test_usage_entropy_is_one_for_uniform_counts_and_zero_for_one_expert():
    assert usage_entropy(np.full(16, 1000)) == 1.0
    assert usage_entropy(np.eye(16)[3] * 500) == 0.0
    rng = np.random.default_rng(0)
    sample = np.bincount(rng.integers(0, 128, 4096), minlength=128)
    assert abs(usage_entropy(sample) - 1.0) < 0.005  # the small-sample bias corrected


def test_synth_command_writes_a_routed_model_and_refuses_it_with_skew(tmp_path, capsys):
    from strata.cli.main import main

    out = tmp_path / "m.gguf"
    argv = ["synth", str(out), "--shape", "tiny", "--layers", "1", "--routing-entropy", "0.95"]
    assert main(argv + ["--skew", "1"]) == 2
    assert "--routing-entropy" in capsys.readouterr().err and not out.exists()
    assert main(argv) == 0
    assert "usage entropy per layer" in capsys.readouterr().out
    assert out.is_file() and not list(tmp_path.glob("*uncalibrated*"))
    assert "strata.synth.routing_entropy" in gguf.GGUFReader(out).fields
