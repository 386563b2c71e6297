"""The forward pass: drives a device tier layer by layer with the routing module in between.

T = tokens in the step, D = hidden, E = experts, K = experts per token, V = vocab.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from strata.gpu.tier import DeviceTier
from strata.model.loader import Model
from strata.routing import route_topk


@dataclass
class StepStats:
    tokens: int = 0
    expert_picks: int = 0
    expert_hist: np.ndarray | None = field(default=None, repr=False)  # [L, E] pick counts


class Engine:
    """Prefill and decode over one sequence (KV cache in the tier); `pos` is the next position."""

    def __init__(self, model: Model, tier: DeviceTier | None = None, n_ctx: int | None = None):
        self.model, self.args = model, model.args
        if tier is None:
            from strata.gpu.host import HostTier

            tier = HostTier(model, n_ctx=n_ctx or min(model.args.n_ctx_train, 4096))
        self.tier = tier
        self.pos = 0
        self.stats = StepStats(
            expert_hist=np.zeros((self.args.n_layer, self.args.n_expert), np.int64)
        )

    @property
    def n_ctx(self) -> int:
        return self.tier.n_ctx

    def reset(self, keep: int = 0) -> None:
        """Forget the sequence past `keep` positions (the KV rows beyond are overwritten later)."""
        self.pos = min(self.pos, keep)

    def forward(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Run `tokens` at positions pos..; logits [V] of the last token ([T, V] if all_logits)."""
        a, tier = self.args, self.tier
        ids = np.asarray(tokens, dtype=np.int64)  # [T]
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("forward needs a non-empty 1-D list of token ids")
        if ids.min() < 0 or ids.max() >= a.n_vocab:
            raise ValueError(f"token id out of range 0..{a.n_vocab - 1}")
        if self.pos + ids.size > self.n_ctx:
            raise ValueError(f"context full: {self.pos + ids.size} tokens > n_ctx {self.n_ctx}")
        x = tier.embed(ids)  # [T, D]
        for i in range(a.n_layer):
            x = tier.attention(i, x, self.pos)
            h, logits = tier.router(i, x)  # [T, D], [T, E]
            topk, weights, _ = route_topk(logits, a.n_expert_used, a.norm_topk)  # [T, K] x2
            np.add.at(self.stats.expert_hist[i], topk.ravel(), 1)
            y = tier.experts(i, h, topk, weights)  # [T, D]
            if a.shared_ff:
                y = y + tier.shared_expert(i, h)
            x = x + y
        self.pos += ids.size
        self.stats.tokens += ids.size
        if not all_logits:
            x = x[-1:]
        out = tier.output(x)  # [T or 1, V]
        return out if all_logits else out[0]
