"""wait_word (strata/gpu/host_wait.py): the host's wait for a word the card writes into pinned
memory. It must see a write made after it started (the load is not hoisted out of the loop) and
let the GIL go meanwhile (the server's event loop runs between tokens)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from strata.gpu.host_wait import wait_word


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_wait_word_sees_the_word_or_gives_up(dtype):
    w = np.random.default_rng().integers(0, 1000, 8).astype(dtype)
    assert wait_word(w, 3, w[3], 1)
    assert not wait_word(w, 3, w[3] + 1, 1000)


def test_wait_word_lets_the_gil_go_and_sees_a_later_write():
    """Another Python thread counts, then writes the word, while this one waits in wait_word:
    with the GIL held, neither could happen before the spins ran out (seconds)."""
    words = np.zeros(4, np.int32)
    ticks = []

    def writer():
        for _ in range(20):
            ticks.append(time.perf_counter())
            time.sleep(0.001)
        words[2] = 7

    t = threading.Thread(target=writer)
    t0 = time.perf_counter()
    t.start()
    seen = wait_word(words, 2, 7, 1 << 31)
    waited = time.perf_counter() - t0
    t.join()
    assert seen and len(ticks) == 20
    assert waited < 5.0, f"waited {waited:.2f} s for a word written after ~20 ms"


def test_decoder_step_counter_starts_over_before_int32_runs_out():
    """Steps are numbered 1..2^31-1 (int32 on the card; 0 is what a fresh ready word holds);
    past that, after the card is idle, the ready words and the release counter start over, so
    a join's ticket (step * L + layer + 1, mod 2^32) is again ahead of the counter."""
    from types import SimpleNamespace

    from strata.gpu.decode_graph import GraphDecoder
    from strata.gpu.pool_join import ticket

    synced = []
    stream = SimpleNamespace(synchronize=lambda: synced.append(1), wait_event=lambda ev: None)
    cp = SimpleNamespace(cuda=SimpleNamespace(Stream=SimpleNamespace(null=SimpleNamespace(
        record=lambda: None))))  # fmt: skip
    g = GraphDecoder.__new__(GraphDecoder)
    arr = lambda *v: SimpleNamespace(a=np.array(v, np.int32))  # noqa: E731
    g.stream, g.cp, g.tokpos_h = stream, cp, arr(0, 0, 0)
    g.ready_h, g.release_h = arr(5, 6, 7), SimpleNamespace(a=np.array([9], np.uint32))
    ws = SimpleNamespace(dec_grids=(8, 32, 132), dec_min_chunk=64, dec_short=0, dec_nsplit=132)
    g.t = SimpleNamespace(attn_ws=ws)  # the tier: its decode attention workspace (_begin)
    g.step = 0
    g._begin(11, 3)
    assert g.step == 1 and list(g.tokpos_h.a) == [11, 3, 1] and not synced
    assert ws.dec_nsplit == 8  # 4 keys: the smallest grid
    g.step = 0x7FFFFFFF - 1
    g._begin(12, 4)
    assert g.step == 0x7FFFFFFF and not synced and list(g.ready_h.a) == [5, 6, 7]
    g.release_h.a[0] = ticket(g.step, 48, 47)
    g._begin(13, 5)
    assert g.step == 1 and synced and list(g.tokpos_h.a) == [13, 5, 1]
    assert not g.ready_h.a.any() and g.release_h.a[0] == 0 < ticket(1, 48, 0)
