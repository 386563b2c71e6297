"""KV blocks for many sequences: a pool of `n_blocks` blocks of `block_size` positions, a block
table per sequence, and a prefix cache that shares full blocks of identical token prefixes.

A full block is named by the hash of its token chain (its parent's hash and its own tokens), so
two sequences whose first N full blocks hold the same tokens share those N blocks (reference
counted). A block is named only once its KV rows are written (`commit`): a sequence admitted
before another finishes the same prompt computes its own copy. A released block whose count
falls to 0 stays cached (named) until a free block is needed; the least recently released goes
first. Every operation that needs blocks checks them all first and raises `KvFull` before
changing anything. Pure Python: the pool's memory lives elsewhere (strata/cpu/paged_kv.py).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from strata.engine.batch_api import KvFull

ROOT = b"strata-kv"  # the parent hash of a sequence's first block


def chain_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The name of a full block: its parent's name and its tokens, 128 bits."""
    return hashlib.blake2b(parent + np.asarray(tokens, np.int64).tobytes(), digest_size=16).digest()


class _Seq:
    __slots__ = ("table", "tokens", "named", "n_kv")

    def __init__(self, tokens: list[int]):
        self.table: list[int] = []  # block ids, in position order
        self.tokens = tokens  # every token whose KV is or will be in the table
        self.named: list[bytes] = []  # chain hashes of the first len(named) (full, written) blocks
        self.n_kv = 0  # positions whose KV rows are written


class BlockManager:
    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(
                f"need n_blocks >= 1 and block_size >= 1, got {n_blocks}, {block_size}"
            )
        self.n_blocks, self.block_size = n_blocks, block_size
        self.ref = [0] * n_blocks
        self.name: list[bytes | None] = [None] * n_blocks  # a full written block's chain hash
        self.by_name: dict[bytes, int] = {}  # named blocks, held or cached
        self.cached: OrderedDict[int, None] = OrderedDict()  # named blocks with ref 0, LRU first
        self.free = list(range(n_blocks - 1, -1, -1))  # unnamed blocks with ref 0 (pop: lowest)
        self.seqs: dict[int, _Seq] = {}

    # ---- what the scheduler and the engine ask ----
    @property
    def used(self) -> int:
        """Blocks held by sequences (cached-only blocks count as free)."""
        return self.n_blocks - len(self.free) - len(self.cached)

    @property
    def available(self) -> int:
        return len(self.free) + len(self.cached)

    def table(self, seq: int) -> list[int]:
        return self.seqs[seq].table

    def blocks_for(self, n_pos: int) -> int:
        return -(-n_pos // self.block_size)

    # ---- admission, growth, release ----
    def admit(self, seq: int, tokens: Sequence[int], n_pos: int) -> int:
        """Reserve blocks for `seq`'s first n_pos positions, of which `tokens` are known; share
        the cached full blocks of their prefix (never the block of the last token, whose logits
        the caller must compute) -> the positions reused. KvFull (nothing changed) if short."""
        if seq in self.seqs:
            raise ValueError(f"sequence {seq} is already admitted")
        bs = self.block_size
        hit: list[int] = []
        names: list[bytes] = []
        parent = ROOT
        for j in range((len(tokens) - 1) // bs):
            h = chain_hash(parent, tokens[j * bs : (j + 1) * bs])
            b = self.by_name.get(h)
            if b is None:
                break
            hit.append(b)
            names.append(h)
            parent = h
        new = self.blocks_for(n_pos) - len(hit)
        cached_hits = sum(1 for b in hit if self.ref[b] == 0)
        if new > self.available - cached_hits:
            raise KvFull(
                f"sequence {seq}: {new} KV blocks needed, {self.available - cached_hits} free"
            )
        for b in hit:
            self._hold(b)
        s = _Seq(list(tokens))
        s.table = hit + [self._take() for _ in range(new)]
        s.named = names
        s.n_kv = len(hit) * bs
        self.seqs[seq] = s
        return s.n_kv

    def grow(self, seqs: Sequence[int], n_pos: Sequence[int]) -> None:
        """Make each seqs[b] hold blocks for n_pos[b] positions, all or none (KvFull)."""
        need = [
            max(0, self.blocks_for(n) - len(self.seqs[q].table))
            for q, n in zip(seqs, n_pos, strict=True)
        ]
        if sum(need) > self.available:
            raise KvFull(f"{sum(need)} KV blocks needed, {self.available} free")
        for q, n in zip(seqs, need, strict=True):
            self.seqs[q].table.extend(self._take() for _ in range(n))

    def commit(self, seq: int, n_kv: int, new_tokens: Sequence[int] = ()) -> None:
        """`seq`'s KV rows are written up to position n_kv (`new_tokens` appended to its known
        tokens first): its full blocks are named and become shareable."""
        s, bs = self.seqs[seq], self.block_size
        s.tokens.extend(new_tokens)
        s.n_kv = n_kv
        while (len(s.named) + 1) * bs <= min(n_kv, len(s.tokens)):
            j = len(s.named)
            h = chain_hash(s.named[-1] if s.named else ROOT, s.tokens[j * bs : (j + 1) * bs])
            s.named.append(h)
            b = s.table[j]
            if h not in self.by_name and self.name[b] is None:
                self.by_name[h] = b  # else an equal block is named already: b stays private
                self.name[b] = h

    def release(self, seq: int) -> None:
        """Forget `seq`: its named blocks stay cached until evicted, the rest are free."""
        s = self.seqs.pop(seq)
        for b in reversed(s.table):  # the tail first: a prefix's head outlives its tail in LRU
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.name[b] is not None:
                    self.cached[b] = None
                else:
                    self.free.append(b)

    # ---- internals ----
    def _hold(self, b: int) -> None:
        if self.ref[b] == 0:
            del self.cached[b]
        self.ref[b] += 1

    def _take(self) -> int:
        """A block with ref 0 for new rows: a free one, else the least recent cached one."""
        if self.free:
            b = self.free.pop()
        else:
            b, _ = self.cached.popitem(last=False)
            del self.by_name[self.name[b]]
            self.name[b] = None
        self.ref[b] = 1
        return b
