"""The host waiting for a word the card writes into pinned memory, without holding the GIL.

A queued-ahead decode step (decode_graph.py) has the host wait for each layer's plan; a Python
loop would hold the GIL all the while (the server's event loop could not run between tokens),
so the wait spins in compiled code that lets the GIL go, on acquire loads (never hoisted).
"""

from __future__ import annotations

from numba import njit

from strata.cpu.kernels.simd import atomic_load, cpu_relax

SPINS = 1 << 16  # checks a call (~1-10 ms): then the caller looks at the card's stream


@njit(nogil=True, cache=True)
def wait_word(words, i, value, spins):
    """True once words[i] == value (int32/int64 array), False after `spins` checks."""
    for _ in range(spins):
        if atomic_load(words, i) == value:
            return True
        cpu_relax()
    return False
