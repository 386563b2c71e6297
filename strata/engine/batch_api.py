"""What the server's continuous-batching scheduler needs from an engine that decodes many
sequences in one step (`BatchRunner`), and the error it raises when the KV cache is full.

A sequence is named by an int the scheduler picks. Its KV lives in fixed-size blocks of one pool;
identical prompt prefixes share full blocks (a prefix cache with reference counts). The scheduler
admits a sequence, prefills its prompt in bounded chunks between decode steps, decodes all running
sequences one token each per step, and releases a sequence when it ends. When a step would need a
block that is not free, `KvFull` is raised before anything changes; the scheduler then preempts
the newest sequence (release it, and later admit it again with its prompt plus the tokens it made).

B = sequences in a decode step, V = vocab.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class KvFull(Exception):
    """No free KV block for this admission or step; nothing was changed."""


@dataclass
class BatchStats:
    kv_blocks_total: int = 0
    kv_blocks_used: int = 0  # held by running sequences (cached-only blocks are free)
    prefix_hit_tokens: int = 0  # prompt tokens served from the prefix cache, summed
    batch_steps: int = 0  # decode steps run
    batch_rows: int = 0  # sequences summed over decode steps (mean batch = rows / steps)


class BatchRunner(Protocol):
    max_batch: int  # at most this many sequences admitted at once
    n_ctx: int  # at most this many positions per sequence
    stats: BatchStats

    def admit(self, seq: int, tokens: Sequence[int]) -> int:
        """Reserve `seq` with prompt `tokens` (its cached full-block prefix is shared, never
        recomputed) -> the tokens reused. KvFull if the blocks for the whole prompt plus one
        token cannot be had; ValueError if the prompt is longer than n_ctx - 1."""
        ...

    def prefill(self, seq: int, budget: int) -> np.ndarray | None:
        """Run up to `budget` of `seq`'s prompt tokens not yet run -> the logits [V] of the
        prompt's last token once the whole prompt has run, else None."""
        ...

    def decode(self, seqs: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Feed tokens[b] to seqs[b] at its next position, all in one step -> logits [B, V].
        Every seq must have finished its prefill. KvFull (nothing changed) if a block is needed
        and none is free."""
        ...

    def release(self, seq: int) -> None:
        """Forget `seq`; its full prompt blocks stay in the prefix cache until evicted."""
        ...
