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


class TextStream:
    """Sampled token ids -> text pieces for one generation: incremental detokenizing, end of text,
    stop strings (a tail that could begin one is held back), max_tokens and the finish reason, all
    recorded in `result`. `push` each sampled token until `done`, then `close` for the rest."""

    def __init__(self, tokenizer, max_tokens: int, stop: Sequence[str], result: Generation):
        self.tok, self.max_tokens, self.res = tokenizer, max_tokens, result
        self.stops = [s for s in stop if s]
        self.dec = tokenizer.stream()
        self.emitted = 0  # chars of res.text already handed out
        result.finish_reason = "length"
        self.done = max_tokens <= 0

    def push(self, token: int) -> str:
        """Take the next sampled token -> the text it makes safe to show ("" if none yet)."""
        res = self.res
        if token in self.tok.eos_ids:
            res.finish_reason, self.done = "stop", True
            return ""
        res.tokens.append(token)
        res.text += self.dec.push(token)
        cut = min((res.text.find(s) for s in self.stops if s in res.text), default=-1)
        if cut >= 0:
            res.text = res.text[:cut]
            res.finish_reason, self.done = "stop", True
            self.dec = None  # the text ends at the stop string: nothing left to flush
            return ""
        self.done = len(res.tokens) >= self.max_tokens
        safe = len(res.text) - _stop_hold(res.text, self.stops)
        if safe <= self.emitted:
            return ""
        piece, self.emitted = res.text[self.emitted : safe], safe
        return piece

    def close(self) -> str:
        """The generation ended -> the text not handed out yet (held back or left unfinished)."""
        res = self.res
        if self.dec is not None:
            res.text += self.dec.flush()  # bytes of a character the last token left unfinished
            self.dec = None
        piece, self.emitted = res.text[self.emitted :], len(res.text)
        return piece


class Session:
    def __init__(self, model: Model, engine: Engine | None = None, n_ctx: int | None = None):
        self.model = model
        self.engine = engine or Engine(model, n_ctx=n_ctx)
        self.tokenizer = model.tokenizer
        self.history: list[int] = []  # tokens whose KV rows the engine holds

    def _common(self, prompt: Sequence[int]) -> int:
        """The leading tokens of `prompt` the engine's KV rows hold, at most all but one (a
        prompt always runs a token, to give logits)."""
        n = 0
        for a, b in zip(prompt, self.history, strict=False):
            if a != b:
                break
            n += 1
        return min(n, len(prompt) - 1)

    def reuse(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of `prompt` a new generation keeps (`_common`, where a
        recurrent state allows)."""
        n = self._common(prompt)
        if hasattr(self.engine, "reusable"):  # a recurrent state keeps all it holds or nothing
            n = self.engine.reusable(n)
        return n

    def begin(self, prompt: Sequence[int]) -> int:
        """Start a generation of `prompt`: keep the KV rows of its reused prefix -> their count.
        The rest of the prompt is then run with `feed`."""
        n = self.reuse(prompt)
        self.engine.reset(keep=n)
        self.history = list(prompt[:n])
        if getattr(self.engine, "adaptive", None) is not None:
            self.engine.adaptive.new_window()  # --adapt-swaps counts per request
        return n

    def feed(self, tokens: Sequence[int]):
        """Run `tokens` at the next positions -> the logits [V] of the last."""
        logits = self.engine.forward(tokens)
        self.history.extend(tokens)
        return logits

    def _prefill(self, prompt: Sequence[int], spec=None):
        """Run `prompt` past its reused prefix -> (tokens reused, logits [V] of the last); with a
        drafter (`spec`) it runs the prompt and keeps the trunk's rows for drafting."""
        if spec is not None:
            if getattr(self.engine, "adaptive", None) is not None:
                self.engine.adaptive.new_window()
            self.history = list(prompt)
            return spec.prefill(self.history, self._common(prompt))
        n = self.begin(prompt)
        return n, self.feed(prompt[n:])

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
        sampler = Sampler(sampling)
        res.prompt_tokens = len(ids)
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
        text = TextStream(tok, min(max_tokens, budget), stop, res)
        t1 = time.perf_counter()
        # the engine picks the next token on the card where it can (no logits back): the argmax,
        # or the sampling chain with the sampler's next u (the same tokens as sampler(logits))
        greedy = sampling.temperature == 0 and hasattr(self.engine, "decode_greedy")
        on_card = sampling.temperature > 0 and hasattr(self.engine, "decode_sample")
        pending: int | None = None
        ready: list[int] = []  # a verify step's tokens; all but the last already run
        while not text.done:
            if ready:
                nxt = ready.pop(0)
            else:
                nxt = pending if pending is not None else sampler(logits)
            piece = text.push(nxt)
            if piece:
                yield piece
            if text.done or ready:
                continue  # the generation ends, or nxt was run with its step's drafts
            if spec is not None:
                ready = spec.step(nxt, text.max_tokens - len(res.tokens))
                self.history += [nxt, *ready[:-1]]
                continue
            if greedy:
                pending = self.engine.decode_greedy(nxt)
            elif on_card:
                pending = self.engine.decode_sample(nxt, sampling, sampler.draw())
            else:
                logits = self.engine.forward([nxt])
            self.history.append(nxt)
        rest = text.close()
        res.decode_s = time.perf_counter() - t1
        if st is not None:
            res.verify_steps = st.spec_steps - before[0]
            res.drafted = st.spec_drafted - before[1]
            res.accepted = st.spec_accepted - before[2]
        if rest:
            yield rest
