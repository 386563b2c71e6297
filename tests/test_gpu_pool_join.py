"""pool_join (kernels/pool_join.cu): the pool's rows join the MoE sum, read from pinned host
memory once the host's release counter reaches the layer's ticket, and only where the layer's
plan left picks to the pool; against its NumPy reference, and a real wait on the host."""

from __future__ import annotations

import time

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from strata.gpu.decode_graph import Pinned  # noqa: E402
from strata.gpu.pool_join import pool_join, pool_join_ref, ticket  # noqa: E402

pytestmark = pytest.mark.gpu

D, L = 2048 + 40, 48  # a tail past the last full block


def inputs(shared: bool, misses: int):
    g = np.random.default_rng()
    moe, sh, xb, pool = (g.standard_normal(D).astype(np.float32) for _ in range(4))
    stats = np.array([misses + 1, 1, misses, 0.5], np.float32)
    return stats, pool, moe, (sh if shared else None), xb


def run(K, stats, pool, moe, sh, xb, step: int, layer: int, release: int, stream):
    """Launch on `stream` with the counter at `release` -> (x on the card, pinned buffers)."""
    rel_h, pool_h = Pinned(cp, (1,), np.uint32), Pinned(cp, (1, D), np.float32)
    rel_h.a[0] = release
    pool_h.a[0] = pool
    with stream:
        step_d = cp.asarray(np.array([step], np.int32))
        dev = [cp.asarray(a) if a is not None else None for a in (stats, moe, sh, xb)]
        x = cp.full(D, np.nan, np.float32)
        stream.synchronize()
        pool_join(K, dev[0], rel_h.a, step_d, L, layer, pool_h.a, dev[1], dev[2], dev[3], x, D)
    return x, rel_h, pool_h


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("misses", [0, 3])
def test_pool_join_matches_reference(K, shared, misses):
    stats, pool, moe, sh, xb = inputs(shared, misses)
    step, layer = 12345, 47
    s = cp.cuda.Stream(non_blocking=True)
    # released already (misses), or never (no misses: the card must not wait, nor read the rows)
    rel = ticket(step, L, layer) if misses else 0
    x, rel_h, pool_h = run(K, stats, pool, moe, sh, xb, step, layer, rel, s)  # kept till done
    s.synchronize()
    want = pool_join_ref(stats, pool, moe, sh, xb)
    assert np.array_equal(cp.asnumpy(x), want)
    if not misses:  # +0.0 + moe, not the rows
        assert not np.array_equal(want, pool_join_ref(stats + [0, 0, 1, 0], pool, moe, sh, xb))


def test_pool_join_waits_for_the_host(K):
    """The card holds at the join until the counter reaches the ticket (a counter one short,
    then wrapped past 2^32, still holds it), and reads the rows the host wrote before it."""
    if getattr(cp, "__emulated__", False):
        pytest.skip("the emulator runs a kernel to its end at launch: nothing to wait on")
    stats, pool, moe, sh, xb = inputs(True, 2)
    step, layer = 2**31 - 1, 5  # the ticket wraps around 2^32
    want_ticket = ticket(step, L, layer)
    s = cp.cuda.Stream(non_blocking=True)
    x, rel_h, pool_h = run(K, stats, np.zeros(D, np.float32), moe, sh, xb, step, layer,
                           (want_ticket - 1) & 0xFFFFFFFF, s)  # fmt: skip
    time.sleep(0.05)
    assert not s.done, "the join ran before its release"
    pool_h.a[0] = pool  # the rows first, then the counter
    rel_h.a[0] = want_ticket
    t0 = time.perf_counter()
    s.synchronize()
    assert time.perf_counter() - t0 < 5.0
    assert np.array_equal(cp.asnumpy(x), pool_join_ref(stats, pool, moe, sh, xb))
