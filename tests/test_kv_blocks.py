"""The KV block manager (strata/engine/kv_blocks.py): tables, shared full prefix blocks with
reference counts, LRU eviction of cached blocks, and KvFull that changes nothing."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from strata.engine.batch_api import KvFull
from strata.engine.kv_blocks import BlockManager

BS = 4


def _state(m: BlockManager):
    return copy.deepcopy((m.ref, m.name, m.by_name, list(m.cached), m.free, {
        q: (s.table, s.tokens, s.named, s.n_kv) for q, s in m.seqs.items()}))  # fmt: skip


def _prompt(rng, n):
    return rng.integers(0, 1000, n).tolist()


def test_tables_cover_the_prompt_plus_one_token():
    m = BlockManager(8, BS)
    assert m.admit(0, list(range(7)), 8) == 0
    assert len(m.table(0)) == 2 and m.used == 2
    m.grow([0], [9])
    assert len(m.table(0)) == 3 and m.used == 3 and m.available == 5


def test_full_written_blocks_are_shared_with_refcounts():
    rng = np.random.default_rng(1)
    p = _prompt(rng, 11)  # 2 full blocks and 3 tokens
    m = BlockManager(16, BS)
    m.admit(0, p, 12)
    assert m.admit(1, p, 12) == 0  # nothing written yet: nothing to share
    m.commit(0, 11)
    q = p[:9] + [7, 7, 7]
    assert m.admit(2, q, 13) == 8  # both full blocks of the common prefix
    assert m.table(2)[:2] == m.table(0)[:2]
    assert [m.ref[b] for b in m.table(0)[:2]] == [2, 2]
    assert m.table(2)[2] not in m.table(0)
    other = [p[0] + 1] + p[1:]
    assert m.admit(3, other, 12) == 0  # a chain: a different first block shares nothing


def test_the_last_tokens_block_is_never_shared():
    rng = np.random.default_rng(2)
    p = _prompt(rng, 8)  # exactly 2 full blocks: the second holds the last token
    m = BlockManager(8, BS)
    m.admit(0, p, 9)
    m.commit(0, 8)
    assert m.admit(1, p, 9) == 4


def test_released_blocks_stay_cached_until_evicted_lru():
    rng = np.random.default_rng(3)
    a, b = _prompt(rng, 9), _prompt(rng, 9)
    m = BlockManager(6, BS)
    for q, p in ((0, a), (1, b)):
        m.admit(q, p, 10)  # 3 blocks each
        m.commit(q, 9)
    m.release(0)
    m.release(1)
    assert m.used == 0 and m.available == 6 and len(m.cached) == 4  # 2 full blocks each
    a_blocks = m.by_name.copy()
    m.admit(2, _prompt(rng, 9), 10)  # 2 free blocks, then the least recent cached: a's tail
    assert len(m.cached) == 3 and len(m.by_name) == len(a_blocks) - 1
    m.release(2)
    assert m.admit(4, b, 10) == 8  # b's blocks are still cached
    assert m.admit(3, a, 10) == 4  # a's head block is, its tail is gone
    assert m.used == 6


def test_kv_full_changes_nothing():
    rng = np.random.default_rng(4)
    p = _prompt(rng, 9)
    m = BlockManager(5, BS)
    m.admit(0, p, 10)
    m.commit(0, 9)
    m.release(0)  # 2 cached, 3 free
    m.admit(1, p, 10)  # reuses 2 cached, takes 1 free: 2 left
    m.admit(2, _prompt(rng, 3), 4)  # 1 left
    before = _state(m)
    with pytest.raises(KvFull):
        m.admit(3, _prompt(rng, 6), 7)  # needs 2
    assert _state(m) == before
    with pytest.raises(KvFull):
        m.grow([1, 2], [13, 5])  # needs 1 + 1
    assert _state(m) == before
    m.grow([1, 2], [13, 4])  # needs 1: fits
    assert m.available == 0


def test_cached_hits_are_not_counted_as_free_for_the_same_admission():
    rng = np.random.default_rng(5)
    p = _prompt(rng, 9)
    m = BlockManager(3, BS)
    m.admit(0, p, 10)
    m.commit(0, 9)
    m.release(0)  # 2 cached, 1 free
    before = _state(m)
    with pytest.raises(KvFull):  # 2 hits + 2 new > 3 blocks: the hits are not free for it
        m.admit(1, p + _prompt(rng, 4), 14)
    assert _state(m) == before
    assert m.admit(1, p, 10) == 8 and m.available == 0


def test_random_admit_release_keeps_counts_consistent():
    rng = np.random.default_rng(6)
    m = BlockManager(24, BS)
    base = _prompt(rng, 12)
    live: dict[int, int] = {}
    for q in range(200):
        if live and rng.random() < 0.45:
            s = int(rng.choice(list(live)))
            m.release(s)
            del live[s]
            continue
        n = int(rng.integers(1, 14))
        p = base[: int(rng.integers(0, 12))] + _prompt(rng, n)
        try:
            m.admit(q, p, len(p) + 1)
        except KvFull:
            continue
        m.commit(q, len(p))
        live[q] = len(p)
        held = [b for s in m.seqs.values() for b in s.table]
        assert all(m.ref[b] == held.count(b) for b in range(m.n_blocks))
        assert m.used == len(set(held))
        assert set(m.free).isdisjoint(m.cached) and not set(held) & (set(m.free) | set(m.cached))
        assert all(m.name[b] == h for h, b in m.by_name.items())
