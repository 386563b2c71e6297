"""`EngineRunner`: the `BatchRunner` protocol over single-sequence engines, one `Session` (an
engine with its own KV cache) per slot, so the continuous-batching scheduler serves every tier.

A sequence takes a free slot, preferring the one whose KV rows hold the longest prefix of its
prompt (the prefix cache of this runner: whole slots, not blocks); its prompt runs in chunks of the
scheduler's budget; a decode step runs each sequence's engine in turn. There is no paged KV: a
"block" here is one slot's whole KV cache, and `KvFull` means no slot is free.

B = sequences in a decode step, V = vocab.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strata.engine.batch_api import BatchStats, KvFull
from strata.engine.session import Session


@dataclass
class _Seq:
    slot: int
    todo: list[int]  # prompt tokens not yet run


class EngineRunner:
    def __init__(self, sessions: Sequence[Session]):
        if not sessions:
            raise ValueError("the runner needs at least one session (slot)")
        self.sessions = list(sessions)
        self.max_batch = len(self.sessions)
        self.n_ctx = min(s.engine.n_ctx for s in self.sessions)
        self.stats = BatchStats(kv_blocks_total=self.max_batch)
        self._free = list(range(self.max_batch))
        self._seqs: dict[int, _Seq] = {}
        self._rows: np.ndarray | None = None  # [max_batch, V], made at the first decode

    @property
    def engines(self) -> list:
        return [s.engine for s in self.sessions]

    def admit(self, seq: int, tokens: Sequence[int]) -> int:
        if seq in self._seqs:
            raise ValueError(f"sequence {seq} is already admitted")
        if not tokens:
            raise ValueError("the prompt is empty")
        if len(tokens) > self.n_ctx - 1:
            raise ValueError(
                f"prompt of {len(tokens)} tokens does not fit the context of {self.n_ctx}"
            )
        if not self._free:
            raise KvFull("every slot holds a sequence")
        best = max(self._free, key=lambda i: self.sessions[i].reuse(tokens))
        self._free.remove(best)
        n = self.sessions[best].begin(tokens)
        self._seqs[seq] = _Seq(best, list(tokens[n:]))
        self.stats.kv_blocks_used += 1
        self.stats.prefix_hit_tokens += n
        return n

    def prefill(self, seq: int, budget: int) -> np.ndarray | None:
        s = self._seqs[seq]
        if not s.todo:
            raise ValueError(f"sequence {seq} has no prompt left to run")
        chunk, s.todo = s.todo[: max(budget, 1)], s.todo[max(budget, 1) :]
        logits = self.sessions[s.slot].feed(chunk)  # [V]
        return None if s.todo else np.array(logits, np.float32, copy=True)

    def decode(self, seqs: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        if len(seqs) != len(tokens):
            raise ValueError(f"{len(seqs)} sequences but {len(tokens)} tokens")
        for q in seqs:
            if self._seqs[q].todo:
                raise ValueError(f"sequence {q} has not finished its prefill")
        for b, (q, t) in enumerate(zip(seqs, tokens, strict=True)):
            logits = self.sessions[self._seqs[q].slot].feed([int(t)])  # [V]
            if self._rows is None:
                self._rows = np.empty((self.max_batch, logits.shape[-1]), np.float32)
            self._rows[b] = logits
        self.stats.batch_steps += 1
        self.stats.batch_rows += len(seqs)
        return self._rows[: len(seqs)]  # [B, V], valid until the next decode

    def release(self, seq: int) -> None:
        s = self._seqs.pop(seq, None)
        if s is None:
            return
        self._free.append(s.slot)
        self.stats.kv_blocks_used -= 1

    def close(self) -> None:
        for e in self.engines:  # flush traces, stop CPU pools
            close = getattr(e, "close", None)
            if callable(close):
                close()
