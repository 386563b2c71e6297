"""The pool serving a queued decode step: every layer's misses in one compiled call a step.

    L = layers, K = picks a token, E = experts, D = hidden, R = 32-bit words of a record

A queued-ahead decode step (strata/gpu/decode_graph.py) leaves, for each layer i, a routing
record in pinned host memory, then the step number in ready[i]; it waits at layer i's join until
the host has counted release[0] up to the layer's ticket, and reads the pool's rows from y when
the record has misses. Served from Python, each layer costs a Python round (wait, counts, the
miss list, the pool's call, the copy into y, the release): ~20-40 us with the caches the pool's
14 MB just went through. `StepServer.run` does all of it for every layer in one nogil compiled
call: wait for the record, count it, list the misses, run them on the pool's resident team
(`pool._run_team`, the same code as `ExpertPool.run_layer`: the same bits) straight into y,
and publish the ticket with a release store. It returns to Python only when done, when a wait
runs long (the caller checks that the card still runs, then calls again), or when a layer needs
something Python does (an expert not yet copied to RAM, a pool that fell back to regions).

A record's layout and the statuses `run` returns are defined once, in `strata.quant.plan_record`.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from strata.cpu.clock import tick_hz
from strata.cpu.kernels.simd import atomic_load, atomic_store, cpu_relax, cycle_counter
from strata.cpu.pool import ExpertPool
from strata.cpu.pool.schedule import ERR_BARRIER
from strata.cpu.pool.team_job import L_GGUF, L_LEN, L_NBYTES, _run_team
from strata.cpu.team import address
from strata.quant.plan_record import BAD_ID, BARRIER, DONE, FILL, WAIT, words

# counters [C_LEN] f64 that `run` adds to
C_BEFORE, C_SUBST, C_MISSES, C_RATIO, C_BYTES, C_GGUF, C_LAYERS = range(7)
C_LEN = 8
WAIT_SPINS = 1 << 16  # checks of a ready word before `run` returns WAIT (~1-10 ms)


@njit(cache=True, nogil=True)
def _serve(
    recs_i, recs_f, k, d, ready, release, step, first, spins, y, loaded, hist, ldescs,
    tokb, exb, wtb, cnt, stamps, job, ctl,
    nt, min_tasks, chunk, pf,
):  # fmt: skip
    """Layers first.. of step `step`: (status, layer) as `StepServer.run` documents."""
    n_layer = ready.shape[0]
    o_ids, o_w, o_slot, o_st, o_h = k, 2 * k, 3 * k, 4 * k, 4 * k + 4  # plan_record.offsets(k)
    haddr = recs_f.ctypes.data
    row = recs_f.shape[1] * 4  # bytes a record
    for i in range(first, n_layer):
        t0 = cycle_counter()
        waited = 0
        while atomic_load(ready, i) != step:
            waited += 1
            if waited > spins:
                return WAIT, i
            cpu_relax()
        t1 = cycle_counter()
        after = recs_f[i, o_st + 2]
        n = 0
        if after > 0:
            for j in range(k):
                if recs_i[i, o_slot + j] < 0:
                    e = recs_i[i, o_ids + j]
                    if e < 0 or e >= loaded.shape[1]:
                        return BAD_ID, i
                    if not loaded[i, e]:
                        return FILL, i  # counted by the Python round that fills it
                    tokb[n] = 0
                    exb[n] = e
                    wtb[n] = recs_f[i, o_w + j]
                    n += 1
        t2 = cycle_counter()
        if after > 0 and n == 0:  # (a record at odds with itself: the rows the card reads)
            y[:] = 0.0
        if n > 0:
            h = numba.carray(address(haddr + i * row + o_h * 4), (1, d), np.float32)
            na = _run_team(
                h, tokb[:n], exb[:n], wtb[:n], y, ldescs[i], job, ctl,
                nt, min_tasks, chunk, pf,
            )  # fmt: skip
            if na == -ERR_BARRIER:
                return BARRIER, i  # not counted: the Python round runs this layer again
            cnt[C_BYTES] += na * ldescs[i, L_NBYTES]
            cnt[C_GGUF] += na * ldescs[i, L_GGUF]
        for j in range(k):
            e0 = recs_i[i, j]
            if 0 <= e0 < hist.shape[1]:
                hist[i, e0] += 1
        cnt[C_BEFORE] += recs_f[i, o_st]
        cnt[C_SUBST] += recs_f[i, o_st + 1]
        cnt[C_MISSES] += after
        cnt[C_RATIO] += recs_f[i, o_st + 3]
        cnt[C_LAYERS] += 1
        t3 = cycle_counter()
        stamps[i, 0], stamps[i, 1], stamps[i, 2], stamps[i, 3] = t0, t1, t2, t3
        # the ticket (strata.gpu.pool_join.ticket), after every write to y
        atomic_store(release, 0, (step * n_layer + i + 1) & 0xFFFFFFFF)
    return DONE, n_layer


class StepServer:
    """Serves queued decode steps' misses from routing records with `pool` (see the module doc).

    layers: the L `LayerWeights`; recs [L, R] uint32 (a record a layer), ready [L] int32,
    release [1] uint32, y [1, D] float32: the step's pinned arrays, kept for every step;
    hist [L, E] int64: router-pick counts to add to; loaded [L, E] bool: experts whose bytes
    the layers can read (None: all; a view, so later fills count).
    Build it with `StepServer.build`, which returns None where the pool cannot serve this way
    (no resident team: regions, one thread, a platform without futexes).
    """

    def __init__(self, pool: ExpertPool, layers, k, recs, ready, release, y, hist, loaded, ldescs):
        lw = layers[0]
        self.pool = pool
        self.k, self.d = k, y.shape[1]
        self.recs_i, self.recs_f = recs.view(np.int32), recs.view(np.float32)
        self.ready, self.release, self.y = ready, release, y
        self.hist = hist
        n_layer = ready.shape[0]
        self.loaded = np.ones((n_layer, lw.gate.n_expert), bool) if loaded is None else loaded
        self.ldescs = ldescs
        self.tokb = np.zeros(self.k, np.int32)
        self.exb = np.zeros(self.k, np.int32)
        self.wtb = np.zeros(self.k, np.float32)
        self.counts = np.zeros(C_LEN, np.float64)
        self.stamps = np.zeros((n_layer, 4), np.int64)
        self._lw = lw
        g, u, dn = lw.gate, lw.up, lw.down
        self._ws_key = (g.cols, g.rows, g.n_expert, (g.act, u.act, dn.act))
        self._fn = None

    def _workspace(self) -> None:
        """The pool's workspaces as a step needs them (`run_layer` may have cut them to another
        layer's activation types, or fewer tasks, since): one dictionary lookup when they are."""
        ws = self.pool._ws
        if ws.get("key") != self._ws_key or ws["t_cap"] < 1 or ws["n_cap"] < self.k:
            self.pool._workspace(1, self.k, *self._ws_key)
            ws["ws_lw"] = self._lw

    @classmethod
    def build(cls, pool: ExpertPool, layers, recs, ready, release, y, hist, loaded=None):
        """A server, or None where this pool or these arrays cannot be served in one call."""
        n_layer = len(layers)
        if not layers or ready.shape != (n_layer,) or recs.shape[0] != n_layer:
            return None
        if recs.dtype != np.uint32 or ready.dtype != np.int32 or release.dtype != np.uint32:
            return None
        if y.dtype != np.float32 or y.ndim != 2 or y.shape[0] != 1 or not y.flags.c_contiguous:
            return None
        k = (recs.shape[1] - y.shape[1] - 4) // 4
        if k < 1 or recs.shape[1] != words(k, y.shape[1]):
            return None
        if not recs.flags.c_contiguous:
            return None

        def key(lw):  # one workspace serves layers of one shape and activation types
            g = lw.gate
            return (g.n_expert, g.rows, g.cols, g.act, lw.up.act, lw.down.act)

        shape = key(layers[0])
        ldescs = np.zeros((n_layer, L_LEN), np.int64)
        for i, lw in enumerate(layers):
            if key(lw) != shape or shape[2] != y.shape[1]:
                return None
            desc = pool._plan(lw)[3]
            if desc is None:
                return None
            ldescs[i] = desc
        if not (pool.team and pool.fused):
            return None
        hist = np.zeros((n_layer, shape[0]), np.int64) if hist is None else hist
        return cls(pool, layers, k, recs, ready, release, y, hist, loaded, ldescs)

    def usable(self) -> bool:
        """False once the pool left the team (a barrier timed out): serve from Python then."""
        return self.pool.team

    def run(self, step: int, first: int = 0, spins: int = WAIT_SPINS) -> tuple[int, int]:
        """Serve layers first.. of step `step` -> (status, layer): (DONE, L); (WAIT, i): layer
        i's record was not ready after `spins` checks (call again from i once the card is known
        to run); (FILL, i): layer i misses an expert `loaded` lacks, (BARRIER, i): the team
        timed out, (BAD_ID, i): an expert id out of range: serve layer i from Python (it is not
        counted nor released), then call again from i + 1."""
        args = (
            self.recs_i, self.recs_f, self.k, self.d, self.ready, self.release, step, first,
            spins, self.y, self.loaded, self.hist, self.ldescs, self.tokb, self.exb, self.wtb,
            self.counts, self.stamps, self.pool._job,
        )  # fmt: skip
        self._workspace()
        team = self.pool.team_now()
        args += (team.ctl, *self.pool.team_knobs())
        if self._fn is None:
            from strata.cpu.kernels.dispatch import specialized

            self._fn = specialized(_serve, args, ())
        with team.lock:
            status, layer = self._fn(*args)
        if status == BARRIER:
            self.pool.team = False
            print(
                "strata: CPU pool team timed out at a barrier; using parallel regions from now on"
            )
        return int(status), int(layer)

    def take_counts(self) -> dict[str, float]:
        """The counters `run` added up since the last take (then zeroed)."""
        c = self.counts
        out = {
            "misses_before_car": c[C_BEFORE],
            "substitutions": c[C_SUBST],
            "misses": c[C_MISSES],
            "ratio_sum": c[C_RATIO],
            "bytes": c[C_BYTES],
            "gguf_bytes": c[C_GGUF],
            "layers": c[C_LAYERS],
        }
        c[:] = 0.0
        return out

    def windows(self, first: int, end: int) -> np.ndarray:
        """Seconds [end - first, 3] of layers first..end-1 of the last run: waiting for the
        record, counting it, the pool."""
        s = self.stamps[first:end].astype(np.float64)
        return np.diff(s, axis=1) / tick_hz()
