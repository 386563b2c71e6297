"""MTP speculative decoding: the model's NextN block drafts, the trunk verifies in one forward.

A step starts from the last token `t` (at position p, not yet run). The NextN block first catches
up: its KV rows from the last valid position through p-1 are written from the trunk's own
output-normed rows h and the tokens after them, and its last row drafts d1 (the token after t).
Each further draft feeds the block its own head-normed row and the previous draft (positions
p, p+1, ..). Drafting stops at N, or where a draft's probability under the block falls below
min_p. The trunk then runs [t, d1..dn] in one forward (all logits); the longest prefix of drafts
equal to the trunk's greedy tokens is kept, plus the trunk's own token after it, so the tokens are
those of plain greedy decoding. The rest is taken back: KV rows by position (`Engine.reset`), the
DeltaNet states by the tier's `verify_begin`/`verify_keep` (a copy before the forward, then on a
rejection the saved state replayed over the kept rows only: the recurrence, not the trunk, which
costs a fraction of a re-run and none of the memory of a state per position). The NextN block's
rows written by chained drafts are overwritten by the next catch-up from the trunk's true rows.
The verify forward computes each row as a one-token step would (the tier attends row by row while
verifying; every other op sums within a row), so its greedy tokens are those of --spec 0 bit for
bit, not only up to float noise that a near tie would turn into another token.

Greedy only: a sampled request decodes without drafts (the session's choice).

T = tokens in the verify step (1 + drafts), D = hidden, V = vocab, C = context positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.engine.engine import Engine


class SpecUnsupported(ValueError):
    """--spec asked of a model or tier that cannot draft (one line)."""


@dataclass(frozen=True)
class SpecKnobs:
    n: int  # most drafts a step
    min_p: float = 0.0  # stop drafting below this draft probability

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"--spec must be >= 1 to draft, got {self.n}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"--spec-min-p must be in [0, 1], got {self.min_p}")


def spec_refusal(model, tier) -> str | None:
    """Why this model on this tier cannot draft with its NextN block, or None."""
    a = model.args
    if not a.n_nextn:
        return f"{a.arch} model {model.path.name} has no NextN (MTP) block to draft with"
    if not hasattr(tier, "verify_begin"):
        return f"the {tier.name} tier has no NextN drafting"
    return None


class Speculator:
    """The drafting state of an engine's one sequence: the trunk's output-normed rows H [C, D]
    and tokens [C] by position (the NextN block's inputs), how many rows are valid, and how many
    of the block's KV rows are."""

    def __init__(self, engine: Engine, knobs: SpecKnobs):
        why = spec_refusal(engine.model, engine.tier)
        if why:
            raise SpecUnsupported(f"--spec {knobs.n}: {why}")
        self.engine, self.tier, self.knobs = engine, engine.tier, knobs
        c, d = engine.n_ctx, engine.args.n_embd
        self.h = np.empty((c, d), np.float32)  # [C, D] the trunk's rows by position
        self.toks = np.zeros(c, np.int64)  # [C] the token at each position
        self.h_n = 0  # rows of h (and toks) valid: the trunk ran them through this decoder
        self.nextn_n = 0  # the NextN block's valid KV rows (each needs the token after it)

    def prefill(self, tokens: list[int], keep: int) -> tuple[int, np.ndarray]:
        """Run `tokens` after the first `keep` positions already held (fewer if this decoder
        lacks their rows; the engine decides what a recurrent state keeps) -> (kept, logits [V]
        of the last token)."""
        e = self.engine
        keep = e.reusable(min(keep, self.h_n, len(tokens) - 1))
        e.reset(keep=keep)
        new = tokens[keep:]
        logits, h = e.forward_hidden(new)
        self.h[keep : e.pos] = h
        self.toks[keep : e.pos] = new
        self.h_n = e.pos
        self.nextn_n = min(self.nextn_n, max(keep - 1, 0))  # row keep-1 read the old next token
        return keep, logits

    def forget(self) -> None:
        """The engine is about to run tokens this decoder does not see (a sampled request): no
        row is known to match the sequence after it, so the next prefill starts afresh."""
        self.h_n = self.nextn_n = 0

    def _draft(self, p: int, n: int) -> list[int]:
        """Catch the NextN block up through position p-1 (the token at p is toks[p]) and draft
        up to n tokens after it."""
        tier, v = self.tier, self.nextn_n
        x = tier.nextn_hidden(self.h[v:p], self.toks[v + 1 : p + 1], v)[-1:]  # [1, D]
        self.nextn_n = p
        drafts: list[int] = []
        for k in range(n):
            logits = tier.nextn_head(x)[0]  # [V]
            d = int(np.argmax(logits))
            if self.knobs.min_p > 0:
                z = np.exp(logits.astype(np.float64) - logits[d])
                if 1.0 / z.sum() < self.knobs.min_p:
                    break
            drafts.append(d)
            if k + 1 < n:  # the block's own row and its draft, one position on
                x = tier.nextn_hidden(x, np.array([d]), p + k)
        return drafts

    def step(self, last: int, room: int) -> list[int]:
        """Run `last` (and drafts after it, verified) -> the next tokens: the accepted drafts
        (run here too) and the trunk's greedy token after them (not yet run). At most `room`."""
        e, st = self.engine, self.engine.stats
        p = e.pos
        if self.h_n != p:
            raise RuntimeError("the speculative decoder lost track of the sequence")
        self.toks[p] = last
        n = min(self.knobs.n, room - 1, e.n_ctx - p - 1)
        drafts = self._draft(p, n) if n > 0 else []
        feed = [last, *drafts]  # [T]
        if drafts:
            self.tier.verify_begin()
        logits, h = e.forward_hidden(feed, all_logits=True)  # [T, V], [T, D]
        best = logits.argmax(axis=-1)  # [T] the trunk's greedy token after each
        a = 0
        while a < len(drafts) and drafts[a] == best[a]:
            a += 1
        if drafts:
            e.reset(keep=p + a + 1)
            self.tier.verify_keep(a + 1)
        self.h[p : p + a + 1] = h[: a + 1]
        self.toks[p + 1 : p + a + 1] = drafts[:a]
        self.h_n = e.pos
        st.spec_steps += 1
        st.spec_tokens += a + 1
        st.spec_drafted += len(drafts)
        st.spec_accepted += a
        return [*drafts[:a], int(best[a])]
