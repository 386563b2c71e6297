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
