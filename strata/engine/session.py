"""A generation session: prompt-prefix reuse, prefill, decode loop, stop tokens and stop strings."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from strata.engine.engine import Engine
from strata.engine.sampling import Sampler, SamplingParams
from strata.model.loader import Model


@dataclass
class Generation:
    """What one `generate` call did; filled in as it runs."""

    prompt_tokens: int = 0
    reused_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" | "length"
    prefill_s: float = 0.0
    decode_s: float = 0.0
    # speculative decoding: the trunk's decode forwards, NextN drafts verified and accepted
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_verify(self) -> float:
        """Tokens a decode forward of the trunk yielded (the first token comes from prefill)."""
        return (len(self.tokens) - 1) / self.verify_steps if self.verify_steps else 0.0

    @property
    def decode_tps(self) -> float:
        n = max(len(self.tokens) - 1, 0)  # the first token comes out of prefill
        return n / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tps(self) -> float:
        n = self.prompt_tokens - self.reused_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0


def _stop_hold(text: str, stops: Sequence[str]) -> int:
    """How many trailing chars of `text` could still begin a stop string (held back)."""
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return hold


class Session:
    def __init__(self, model: Model, engine: Engine | None = None, n_ctx: int | None = None):
        self.model = model
        self.engine = engine or Engine(model, n_ctx=n_ctx)
        self.tokenizer = model.tokenizer
        self.history: list[int] = []  # tokens whose KV rows the engine holds

    def _prefill(self, prompt: list[int], spec=None):
        n = 0
        for a, b in zip(prompt, self.history, strict=False):
            if a != b:
                break
            n += 1
        n = min(n, len(prompt) - 1)  # always run at least one token to get logits
        if spec is not None:  # the drafter keeps the trunk's rows of the prompt
            self.history = list(prompt)
            return spec.prefill(self.history, n)
        if hasattr(self.engine, "reusable"):  # a recurrent state keeps all it holds or nothing
            n = self.engine.reusable(n)
        self.engine.reset(keep=n)
        self.history = list(prompt)
        return n, self.engine.forward(prompt[n:])

    def generate(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 128,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        result: Generation | None = None,
    ) -> Iterator[str]:
        """Yield text pieces as they are decoded; `result` (if given) records counts and timings."""
        sampling = sampling or SamplingParams()
        res = result if result is not None else Generation()
        tok = self.tokenizer
        ids = tok.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        budget = self.engine.n_ctx - len(ids)
        if budget <= 0:
            raise ValueError(
                f"prompt of {len(ids)} tokens does not fit the context of {self.engine.n_ctx}"
            )
        max_tokens = min(max_tokens, budget)
        sampler = Sampler(sampling)
        stops = [s for s in stop if s]
        res.prompt_tokens = len(ids)
        if getattr(self.engine, "adaptive", None) is not None:
            self.engine.adaptive.new_window()  # --adapt-swaps counts per request
        # greedy requests draft with the model's NextN block where the engine has a drafter
        spec = getattr(self.engine, "spec", None)
        if spec is not None and sampling.temperature > 0:
            spec.forget()
            spec = None
        st = self.engine.stats if spec is not None else None
        before = (st.spec_steps, st.spec_drafted, st.spec_accepted) if st else (0, 0, 0)
        t0 = time.perf_counter()
        res.reused_tokens, logits = self._prefill(ids, spec)
        res.prefill_s = time.perf_counter() - t0
        dec = tok.stream()
        emitted = 0  # chars of res.text already yielded
        t1 = time.perf_counter()
        res.finish_reason = "length"
        # the engine picks the next token on the card where it can (no logits back): the argmax,
        # or the sampling chain with the sampler's next u (the same tokens as sampler(logits))
        greedy = sampling.temperature == 0 and hasattr(self.engine, "decode_greedy")
        on_card = sampling.temperature > 0 and hasattr(self.engine, "decode_sample")
        pending: int | None = None
        ready: list[int] = []  # a verify step's tokens; all but the last already run
        for step in range(max_tokens):
            if ready:
                nxt = ready.pop(0)
            else:
                nxt = pending if pending is not None else sampler(logits)
            if nxt in tok.eos_ids:
                res.finish_reason = "stop"
                break
            res.tokens.append(nxt)
            res.text += dec.push(nxt)
            cut = min((res.text.find(s) for s in stops if s in res.text), default=-1)
            if cut >= 0:
                res.text = res.text[:cut]
                res.finish_reason = "stop"
                dec = None  # the text ends at the stop string: nothing left to flush
                break
            safe = len(res.text) - _stop_hold(res.text, stops)
            if safe > emitted:
                yield res.text[emitted:safe]
                emitted = safe
            if ready or step + 1 >= max_tokens:
                continue  # nxt was run with its step's drafts, or is the last token
            if spec is not None:
                ready = spec.step(nxt, max_tokens - step - 1)
                self.history += [nxt, *ready[:-1]]
                continue
            if greedy:
                pending = self.engine.decode_greedy(nxt)
            elif on_card:
                pending = self.engine.decode_sample(nxt, sampling, sampler.draw())
            else:
                logits = self.engine.forward([nxt])
            self.history.append(nxt)
        if dec is not None:
            res.text += dec.flush()  # bytes of a character the last token left unfinished
        res.decode_s = time.perf_counter() - t1
        if st is not None:
            res.verify_steps = st.spec_steps - before[0]
            res.drafted = st.spec_drafted - before[1]
            res.accepted = st.spec_accepted - before[2]
        if len(res.text) > emitted:
            yield res.text[emitted:]
