"""The host tier's attention in query chunks (a long prompt's scores bounded by
HOST_ATTN_SCORES_BYTES) against one pass over every row."""

from __future__ import annotations

import numpy as np

import strata.gpu.host as host
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
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-6 * np.abs(v).max())
