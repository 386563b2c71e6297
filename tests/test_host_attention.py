"""The host tier's attention in query chunks (a long prompt's scores bounded by
HOST_ATTN_SCORES_BYTES) against one pass over every row: float noise apart (most rows to 1e-5,
a row whose f16 or Q8 rounding flips to ~1e-3); a wrong mask or key span would be far off."""

from __future__ import annotations

import numpy as np

import strata.cpu.tier as host
from strata.model.loader import load_model


def test_query_chunks_give_one_pass_results(synth_model, monkeypatch):
    model = load_model(synth_model("tiny", "Q4_K", seed=41))
    a = model.args
    g = np.random.default_rng()
    x1 = g.standard_normal((23, a.n_embd)).astype(np.float32)  # a prompt
    x2 = g.standard_normal((6, a.n_embd)).astype(np.float32)  # more, after it is cached
    whole = host.HostTier(model, n_ctx=64)
    want = [
        whole.attention(layer, x, p) for layer in (0, a.n_layer - 1) for x, p in ((x1, 0), (x2, 23))
    ]
    for rows in (1, 2, 5):  # chunks of this many query rows at the longest key span
        monkeypatch.setattr(host, "HOST_ATTN_SCORES_BYTES", 4 * a.n_head * 29 * rows)
        tier = host.HostTier(model, n_ctx=64)
        got = [
            tier.attention(layer, x, p)
            for layer in (0, a.n_layer - 1)
            for x, p in ((x1, 0), (x2, 23))
        ]
        for u, v in zip(got, want, strict=True):
            # per row: BLAS sums chunks in another order, and a flipped f16 rounding of a
            # probability (or Q8 rounding of the output row) moves a row by ~1e-3 of its scale
            err = np.abs(u - v).max(axis=-1) / np.abs(v).max()
            assert (err <= 1e-5).mean() >= 0.8 and err.max() <= 1e-2, np.sort(err)[::-1][:4]


def test_output_sample_is_the_sampling_reference_on_the_last_row(synth_model):
    from types import SimpleNamespace

    from strata.cpu.sampling import sample_ref

    model = load_model(synth_model("tiny", "Q4_K", seed=41))
    x = np.random.default_rng().standard_normal((2, model.args.n_embd)).astype(np.float32)
    tier = host.HostTier(model, n_ctx=8)
    p = SimpleNamespace(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    for u in (0.0, 0.3, 0.999):
        assert tier.output_sample(x, p, u) == sample_ref(tier.output(x[-1:])[0], p, u)
    greedy = SimpleNamespace(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0)
    assert tier.output_sample(x, greedy, 0.5) == int(np.argmax(tier.output(x[-1:])[0]))
