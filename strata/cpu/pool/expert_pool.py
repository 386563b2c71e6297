"""`ExpertPool`: workspaces, compiled entries and the call of one layer's CPU experts."""

from __future__ import annotations

import numba
import numpy as np
from numba.np.ufunc import parallel as _numba_parallel

from strata.cpu.clock import tick_hz
from strata.cpu.kernels.dispatch import specialized
from strata.cpu.layout import ExpertMatrix, prepare_tensor
from strata.cpu.pool.region import _run_layer
from strata.cpu.pool.schedule import (
    BAR_LEN,
    ERR_BARRIER,
    ERR_TOKEN,
    FUSED_LAYERS,
    PREFETCH_BYTES,
    TEAM_MIN_THREADS,
    YB_BYTES,
)
from strata.cpu.pool.team_job import (
    _SLOT,
    JOB_LEN,
    L_AD,
    L_AG,
    L_AU,
    L_GB,
    L_GGUF,
    L_GLU,
    L_LEN,
    L_NBYTES,
    L_NE,
    L_SHARE,
    _run_team,
    _share_address,
)
from strata.cpu.pool.weights import LayerWeights
from strata.cpu.quantize import alloc_act
from strata.cpu.team import SUPPORTED as TEAM_SUPPORTED
from strata.cpu.team import shared_team

# the stamps of one thread in trace[tid] (fused mode and nt = 1): entry, then the end of each
TRACE_STAMPS = (
    "entry",
    "quant_x",
    "barrier1",
    "gate_up",
    "barrier2",
    "quant_h",
    "barrier3",
    "down",
    "barrier4",
    "reduce",
)


_LITERAL_ARGS = (6, 8, 10)  # gk, uk, dk in _run_layer's arguments


# one region per phase: below this many rows a quantization runs on the calling thread (a region
# costs ~3-5 us on 2 cores, quantizing a 768-wide row ~0.8 us); the fused region splits from 1
QUANT_MIN_TASKS = 16


class ExpertPool:
    """Runs one layer's CPU-side experts on `n_threads` Numba threads.

    run_layer(x [T, D] f32, tok [N] i32, expert [N] i32, weight [N] f32, gate, up, down) -> [T, D]

    gate/up/down are expert tensors [E, F, D] / [E, F, D] / [E, D, F]: a `LayerWeights` (from
    `prepare_layer`, passed as `gate`), three `ExpertMatrix`, or anything with
    `.qtype/.shape/.data` (prepared on first use and kept, by identity, until
    `clear_prepared()`: for repacked formats that is a RAM copy of the layer). The result is a
    view into a workspace, overwritten by the next call, unless `out` is given. One pool serves
    one calling thread at a time (the workspaces are shared).

    `fused` (default on) runs the four phases in one parallel region with a spin barrier between
    them instead of one region per phase; it needs a threading layer that runs prange(nt) one
    iteration per thread (FUSED_LAYERS: omp, workqueue) and is switched off, with a message,
    elsewhere. Both ways give the same bits. `team` (default: from TEAM_MIN_THREADS threads where
    `strata.cpu.team.SUPPORTED`) runs the fused phases on the process's resident team of
    `n_threads` (shared by pools of that size; calls from two threads take turns) instead of a
    Numba region: the same bits, no region to start.
    """

    def __init__(
        self,
        n_threads: int | None = None,
        row_chunk: int = 32,
        fused: bool = True,
        team: bool | None = None,
    ):
        limit = numba.config.NUMBA_NUM_THREADS
        n = limit if n_threads is None else int(n_threads)
        if n < 1:
            raise ValueError(f"n_threads must be >= 1, got {n}")
        if n > limit:
            print(f"strata: CPU pool capped at {limit} threads (NUMBA_NUM_THREADS), {n} asked")
            n = limit
        self.n_threads = n
        self.row_chunk = int(row_chunk)
        self.fused = bool(fused)
        if team is None:
            team = n >= TEAM_MIN_THREADS
        self.team = bool(team) and TEAM_SUPPORTED
        self._job = np.zeros(JOB_LEN, np.int64)  # the team's job descriptor
        self._team = None  # the shared team this pool last ran on
        numba.set_num_threads(n)  # launches the threading layer: its ctypes getter exists now
        # the raw getter behind numba.get_num_threads (a private name: fall back if it moves)
        self._get_threads = getattr(_numba_parallel, "_get_num_threads", numba.get_num_threads)
        self._fused_ok: bool | None = None  # known after the first parallel region ran
        self._prepared: dict[int, tuple[object, ExpertMatrix]] = {}
        self._layers: dict[tuple, tuple] = {}  # raw tensor ids -> (tensors, LayerWeights)
        self._ws: dict[str, object] = {}
        self._ws_args: tuple = ()
        self._outs: dict[int, np.ndarray] = {}  # views of the output workspace by T
        self._stats = np.zeros(3, np.int64)
        self._bar = np.zeros(BAR_LEN, np.int64)
        # cycle-counter stamps of the last call: a row of TRACE_STAMPS a thread, then the
        # caller's (before, after); a row is 128 bytes (each thread writes its own)
        self._trace = np.zeros((limit + 1, 16), np.int64)
        self._entries: dict[tuple, object] = {}
        self._plans: dict[int, tuple] = {}  # id(LayerWeights) -> (lw, weight args, entries)
        self.last_active_experts = 0
        self.last_bytes = 0  # bytes the kernels read in the last call
        self.last_gguf_bytes = 0  # the same experts in the GGUF encoding

    # ---- weights
    def clear_prepared(self) -> None:
        """Drop the layers prepared from raw tensors (their repacked copies)."""
        self._prepared.clear()
        self._layers.clear()
        self._plans.clear()

    def _matrix(self, t) -> ExpertMatrix:
        if isinstance(t, ExpertMatrix):
            return t
        hit = self._prepared.get(id(t))
        if hit is None or hit[0] is not t:
            hit = (t, prepare_tensor(t))
            self._prepared[id(t)] = hit
        return hit[1]

    def _layer(self, gate, up, down) -> LayerWeights:
        if isinstance(gate, LayerWeights):
            return gate
        key = (id(gate), id(up), id(down))
        hit = self._layers.get(key)
        if hit is None or hit[0][0] is not gate or hit[0][1] is not up or hit[0][2] is not down:
            lw = LayerWeights(self._matrix(gate), self._matrix(up), self._matrix(down))
            hit = self._layers[key] = ((gate, up, down), lw)
        return hit[1]

    def _plan(self, lw: LayerWeights) -> tuple:
        """(lw, the weight arguments of `_run_layer`, {input flags: entry}, the team's layer
        descriptor or None) kept per layer."""
        plan = self._plans.get(id(lw))
        if plan is None or plan[0] is not lw:
            g, u, d = lw.gate, lw.up, lw.down
            wargs = (g.data, g.kernel, u.data, u.kernel, d.data, d.kernel, g.n_expert)
            wargs += (g.act, u.act, d.act, lw.extras)
            plan = self._plans[id(lw)] = (lw, wargs, {}, self._layer_desc(lw))
        return plan

    def _layer_desc(self, lw: LayerWeights) -> np.ndarray | None:
        """The team's descriptor of a layer (L_* slots), None where it cannot take the layer
        (no team, or weights that are not C-contiguous bytes)."""
        if not self.team or not self.fused or self.n_threads < 2:
            return None  # (the team runs the fused phases only: nothing to compile for it)
        return layer_desc(lw)

    # ---- workspaces
    def _workspace(self, t_n: int, n: int, dim: int, f: int, n_expert: int, acts) -> None:
        ws = self._ws
        key = (dim, f, n_expert, acts)
        if ws.get("key") != key or ws["t_cap"] < t_n or ws["n_cap"] < n:
            t_cap = max(t_n, 2 * ws.get("t_cap", 0) if ws.get("key") == key else t_n, 1)
            n_cap = max(n, 2 * ws.get("n_cap", 0) if ws.get("key") == key else n, 1)
            ag, au, _ = acts
            actg = alloc_act(t_cap, dim)
            ws.update(
                key=key,
                t_cap=t_cap,
                n_cap=n_cap,
                actg=actg,
                actu=actg if au == ag else alloc_act(t_cap, dim),
                acth=alloc_act(n_cap, f),
                h=np.zeros((n_cap, f), np.float32),
                order=np.zeros(n_cap, np.int32),
                cnt=np.zeros(n_expert, np.int64),
                start=np.zeros(n_expert, np.int64),
                active=np.zeros(n_expert, np.int64),
                ufirst=np.zeros(n_expert + 1, np.int64),
                urows=np.zeros(n_expert, np.int64),
                dfirst=np.zeros(n_expert + 1, np.int64),
                drows=np.zeros(n_expert, np.int64),
                # the expert-major down's outputs a task (small decode batches only)
                yb=np.zeros((min(n_cap, max(1, YB_BYTES // (4 * dim))), dim), np.float32),
                out=np.zeros((t_cap, dim), np.float32),
            )
            # barrier and unit counters, the eager quantization's block counters, the pipeline's
            self._bar = np.zeros(BAR_LEN, np.int64)
            names = ("actg", "actu", "acth", "h", "order", "cnt", "start", "active")
            names += ("ufirst", "urows", "dfirst", "drows", "yb")
            self._ws_args = (*(ws[k] for k in names), self._bar, self._stats, self._trace)
            self._outs = {}
            arrays = dict(zip(names, self._ws_args[: len(names)], strict=True))
            arrays.update(bar=self._bar, stats=self._stats, trace=self._trace)
            for a in ("actg", "actu", "acth"):
                arrays.update({f"{a}{i}": v for i, v in enumerate(arrays.pop(a))})
            for name, v in arrays.items():
                k = _SLOT[name]
                self._job[k : k + 3] = (v.ctypes.data, v.shape[0], v.shape[-1])

    def _entry(self, args, lw: LayerWeights):
        """The compiled specialization for these kernels, called without Numba's dispatch.

        `_run_layer` takes the kernel codes as literals; through the dispatcher every call
        would first try (and fail) to type a non-literal version, costing milliseconds.
        """
        key = (
            lw.gate.type_key,
            lw.up.type_key,
            lw.down.type_key,
            tuple(a.flags.writeable for a in args[:5]),
        )  # read-only inputs type differently
        fn = self._entries.get(key)
        if fn is None:
            fn = self._entries[key] = specialized(_run_layer, args, _LITERAL_ARGS)
        return fn

    def _knobs(self, fused: bool) -> tuple:
        # in the fused region a parallel quantization costs no extra region
        min_tasks = 1 if fused else QUANT_MIN_TASKS
        return (self.n_threads, min_tasks, self.row_chunk, PREFETCH_BYTES, fused)

    # ---- where the last call's time went
    def last_phases(self) -> dict[str, np.ndarray] | None:
        """Microseconds each thread spent in each phase of the last call ([n_threads] arrays:
        "start" from the caller's stamp to the thread's entry, the TRACE_STAMPS phases and
        barrier waits, "join" from the thread's end to the caller's), and "total" (the
        caller's two stamps, one value); None after a call in the per-phase mode."""
        nt = self.n_threads
        tr = self._trace
        c0, c1 = tr[nt, 0], tr[nt, 1]
        if c1 == 0 or c1 < c0:
            return None
        us = 1e6 / tick_hz()
        st = tr[:nt, : len(TRACE_STAMPS)].astype(np.float64)
        out = {"start": (st[:, 0] - c0) * us}
        for i in range(1, len(TRACE_STAMPS)):
            out[TRACE_STAMPS[i]] = (st[:, i] - st[:, i - 1]) * us
        out["join"] = (c1 - st[:, -1]) * us
        out["total"] = np.array([(c1 - c0) * us])
        return out

    # ---- the call
    def run_layer(self, x, tok, expert, weight, gate, up=None, down=None, out=None) -> np.ndarray:
        lw = gate if type(gate) is LayerWeights else self._layer(gate, up, down)
        plan = self._plans.get(id(lw))
        if plan is None or plan[0] is not lw:
            plan = self._plan(lw)
        x, weight = _c_array(x, _F32), _c_array(weight, _F32)
        tok, expert = _c_array(tok, _I32), _c_array(expert, _I32)
        if x.ndim != 2:
            raise ValueError(f"x must be [T, D], got shape {list(x.shape)}")
        t_n, dim = x.shape
        n = tok.shape[0]
        g = lw.gate
        if dim != g.cols:
            raise ValueError(f"x has {dim} columns, the experts take {g.cols}")
        if expert.shape[0] != n or weight.shape[0] != n:
            raise ValueError(
                f"tok, expert, weight lengths differ: {n}, {expert.shape[0]}, {weight.shape[0]}"
            )
        ws = self._ws
        if ws.get("ws_lw") is not lw or ws["t_cap"] < t_n or ws["n_cap"] < n:
            u, d = lw.up, lw.down
            self._workspace(t_n, n, dim, g.rows, g.n_expert, (g.act, u.act, d.act))
            ws["ws_lw"] = lw
        if out is None:
            out = self._outs.get(t_n)
            if out is None:
                out = self._outs[t_n] = ws["out"][:t_n]
        elif (
            type(out) is not np.ndarray
            or out.shape != (t_n, dim)
            or out.dtype != np.float32
            or not out.flags.c_contiguous
            or not out.flags.writeable
        ):
            raise ValueError(f"out must be a writable C-contiguous float32 array {(t_n, dim)}")
        flags = (x.flags.writeable, tok.flags.writeable, expert.flags.writeable)
        flags += (weight.flags.writeable,)
        if plan[3] is not None and self.team and self.fused:
            na = self._run_team(plan, flags, x, tok, expert, weight, out)
            if na != -ERR_BARRIER:
                return self._finish(na, lw, t_n, out)
            self.team = False  # a member never came: regions from now on (same bits)
            print(
                "strata: CPU pool team timed out at a barrier; using parallel regions from now on"
            )
        fused = self.fused and self._fused_ok is not False
        if self._fused_ok is None:
            fused = False  # learn the threading layer from a plain call first
        if self._get_threads() != self.n_threads:  # 0.6 us; numba.set_num_threads costs 1.4
            numba.set_num_threads(self.n_threads)
        fn = plan[2].get(flags)
        knobs = self._knobs(fused)
        args = (x, tok, expert, weight, out, *plan[1], *self._ws_args, *knobs)
        if fn is None:
            fn = plan[2][flags] = self._entry(args, lw)
        na = fn(*args)
        if self._fused_ok is None:
            layer = _threading_layer()
            if layer != "?":
                self._fused_ok = layer in FUSED_LAYERS
        elif na == -ERR_BARRIER:  # a barrier timed out: never again on this pool (same bits)
            self._fused_ok = False
            print(
                f"strata: CPU pool barrier timed out under the {_threading_layer()!r} threading"
                " layer; running one parallel region per phase from now on"
            )
            na = fn(*args[: -len(knobs)], *self._knobs(False))
        return self._finish(na, lw, t_n, out)

    def _run_team(self, plan, flags, x, tok, expert, weight, out) -> int:
        """The call on the process's resident team of this size (`_run_team`, `shared_team`)."""
        team = self.team_now()
        fn = self._entries.get(("team", flags))
        args = (x, tok, expert, weight, out, plan[3], self._job, team.ctl, *self.team_knobs())
        if fn is None:
            fn = self._entries[("team", flags)] = specialized(_run_team, args, ())
        with team.lock:
            return fn(*args)

    def team_now(self):
        """The resident team this pool runs on (started, or started again after a fork)."""
        team = self._team
        if team is None or not team.alive():
            team = self._team = shared_team(self.n_threads)
        return team

    def team_knobs(self) -> tuple:
        """`_run_team`'s arguments after ctl: the thread count and the schedule's knobs (not
        `fused`: the team runs the fused phases)."""
        return self._knobs(True)[:-1]

    def _finish(self, na: int, lw: LayerWeights, t_n: int, out: np.ndarray) -> np.ndarray:
        if na < 0:
            if na == -ERR_TOKEN:
                raise ValueError(f"a token index is outside 0..{t_n - 1}")
            raise ValueError(f"an expert id is outside 0..{lw.gate.n_expert - 1}")
        self.last_active_experts = na
        self.last_bytes = na * lw.expert_nbytes
        self.last_gguf_bytes = na * lw.expert_gguf_bytes
        return out


def layer_desc(lw: LayerWeights) -> np.ndarray | None:
    """A layer's descriptor for `_run_team` (L_* slots), None where the weights are not
    C-contiguous bytes."""
    mats = (lw.gate, lw.up, lw.down)
    if not all(m.data.flags.c_contiguous for m in mats):
        return None
    desc = np.zeros(L_LEN, np.int64)
    for i, m in enumerate(mats):
        desc[3 * i : 3 * i + 3] = (m.data.ctypes.data, *m.data.shape)
    desc[L_NE], desc[L_AG], desc[L_AU], desc[L_AD] = lw.gate.n_expert, *(m.act for m in mats)
    desc[L_SHARE] = _share_address(lw.gate.kernel, lw.up.kernel, lw.down.kernel)
    desc[L_NBYTES], desc[L_GGUF] = lw.expert_nbytes, lw.expert_gguf_bytes
    for i, b in enumerate((lw.gate_bias, lw.up_bias, lw.down_bias)):
        desc[L_GB + 3 * i : L_GB + 3 * i + 3] = (b.ctypes.data, *b.shape)
    desc[L_GLU] = lw.glu
    return desc


_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)


def _c_array(a, dt: np.dtype) -> np.ndarray:
    """a as a C-contiguous array of dtype dt: a itself when it already is one (the common case,
    checked without entering np.ascontiguousarray)."""
    if type(a) is np.ndarray and a.dtype is dt and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=dt)


def _threading_layer() -> str:
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel region has run yet (a one-thread pool, or no tasks)
        return "?"
