"""Expert bytes to the card for a prompt's staged experts: host rows gathered into pinned memory
by a few host threads (NumPy's copies release the GIL), then one asynchronous copy per matrix on
the compute stream, so the kernels that read the slots follow the copy in stream order and the
host goes on gathering the next group into the other of two pinned buffers.

E = experts of a layer, R = rows of one expert matrix, S = staging slots.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

CHUNK = 4 << 20  # bytes per host copy job


def consecutive_runs(ids: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) index pairs of the runs of consecutive values in sorted unique ids."""
    if ids.size == 0:
        return []
    cut = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [ids.size]))
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def copy_jobs(dst: np.ndarray, slot: int, src: np.ndarray, n_expert: int, grp: np.ndarray):
    """(dst view, src view) pairs that put the experts `grp` (sorted, unique) of the matrix
    `src` [E*R, row_bytes] into slots 0.. of `dst` [S * slot] bytes, at most CHUNK bytes each:
    one span per run of consecutive experts when an expert fills its slot exactly."""
    flat = src.reshape(-1)
    per = flat.size // n_expert  # bytes of one expert
    spans = []
    for j0, j1 in consecutive_runs(grp):
        e0 = int(grp[j0])
        if per == slot:
            spans.append((j0 * slot, e0 * per, (j1 - j0) * per))
        else:  # smaller than a slot (another layer's experts are bigger): one span each
            spans += [(j * slot, (e0 + j - j0) * per, per) for j in range(j0, j1)]
    jobs = []
    for d0, s0, n in spans:
        for o in range(0, n, CHUNK):
            m = min(CHUNK, n - o)
            jobs.append((dst[d0 + o : d0 + o + m], flat[s0 + o : s0 + o + m]))
    return jobs


class StageUploader:
    """Two pinned buffers of S slots per matrix, filled in turn (see the module docstring)."""

    def __init__(self, cp, slot_bytes: list[int], n_slots: int, threads: int | None = None):
        from strata.gpu.decode_graph import Pinned

        self.cp = cp
        self.slot_bytes = list(slot_bytes)
        self.bufs = [[Pinned(cp, (n_slots * b,), np.uint8) for b in slot_bytes] for _ in range(2)]
        self.events: list = [None, None]
        self.turn = 0
        self.workers = ThreadPoolExecutor(threads or min(8, os.cpu_count() or 1))

    def upload(self, stores, mats, n_expert: int, grp: np.ndarray) -> int:
        """Experts `grp` of the matrices `mats` ([E*R, row_bytes] each) into slots 0..len(grp)-1
        of `stores` (copies queued on the legacy stream); returns the bytes sent."""
        cp = self.cp
        j = self.turn
        self.turn ^= 1
        if self.events[j] is not None:
            self.events[j].synchronize()  # this buffer's last copy has left it
        jobs = []
        for buf, raw, sb in zip(self.bufs[j], mats, self.slot_bytes, strict=True):
            jobs += copy_jobs(buf.a, sb, raw, n_expert, grp)
        list(self.workers.map(lambda p: np.copyto(p[0], p[1]), jobs))
        sent = 0
        for store, buf, sb in zip(stores, self.bufs[j], self.slot_bytes, strict=True):
            n = grp.size * sb
            cp.cuda.runtime.memcpyAsync(
                store.buf.data.ptr, buf.a.ctypes.data, n, cp.cuda.runtime.memcpyHostToDevice, 0
            )
            sent += n
        self.events[j] = cp.cuda.Stream.null.record()
        return sent
