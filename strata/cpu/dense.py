"""Dense matrices on the CPU pool's kernels: y = x @ W.T read from the weight's own encoding.

    T = tokens, R = rows (outputs), C = columns (inputs)

The host tier's float path keeps every dense weight dequantized to float32 and multiplies the
rounded activation by it (NumPy/BLAS): 4 bytes read a weight a token, ~4.9 GB a token for
Qwen3-30B-A3B's attention and output head. `QuantLinear` instead quantizes x once as llama.cpp's
CPU matmul does (the weight's vec_dot type) and runs the pool's dot kernels row by row, straight
from the quantized bytes: the integer arithmetic and roundings of ggml's vec_dot, not of a float
GEMM (results agree with the float path to float noise, not bit for bit; that float path is the
reference tests hold this one to). Float weights (F32/F16/BF16, e.g. the router) run the float
kernels the same way.

The rows run as a job of the process's resident team (strata/cpu/team.py), the one the CPU pool
and the CPU-only decode step (step.py) run on: one set of threads for the whole host tier (a
second, Numba's parallel regions, would fight the team's spinning members for the cores).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import literally, njit

from strata.cpu.kernels.dispatch import dot, dotn, native_address
from strata.cpu.kernels.tile import TILE, stack_buffer
from strata.cpu.layout import ExpertMatrix, prepare
from strata.cpu.pool.team_job import _jact, _put
from strata.cpu.quantize import alloc_act, quantize_rows
from strata.cpu.team import CTL_LEN, SUPPORTED, address, call_job, shared_team, team_go, team_join

# a dense job (int64 [DJ_LEN]): matrices in it, activation rows T, the activation arrays
# (5 x (address, rows, cols), `_jact`'s layout), then per matrix (weight address, rows R, row
# bytes, address of its output y [T, R])
DJ_M, DJ_T, DJ_ACT, DJ_MAT, DJ_MAX = 0, 1, 2, 17, 3
DJ_LEN = DJ_MAT + 4 * DJ_MAX
# a job of fewer weight bytes x rows runs on the calling thread: a team start (~1 us on a quiet
# host, a scheduler slice on a busy one) would cost more than it saves
DENSE_SPLIT_BYTES = 32 << 10
_SOLO = np.zeros(CTL_LEN, np.int64)  # a control block no member reads: jobs on the caller only


@njit(cache=True, nogil=True)
def _dense_share(tid, nt, jaddr, code, z1, z2):
    """Thread tid's rows of the dense job at jaddr: y[a, r] = row r of w against act row a, the
    rows of the job's matrices taken as one range split evenly over nt threads."""
    literally(code)
    job = numba.carray(address(jaddr), (DJ_LEN,), np.int64)
    if tid >= nt:
        return 0
    xq, xd, xb, x8, xf = _jact(job, DJ_ACT)
    t = job[DJ_T]
    total = 0
    for m in range(job[DJ_M]):
        total += job[DJ_MAT + 4 * m + 1]
    r0, r1 = total * tid // nt, total * (tid + 1) // nt
    base = 0
    for m in range(job[DJ_M]):
        o = DJ_MAT + 4 * m
        rows = job[o + 1]
        a0, a1 = max(r0 - base, 0), min(r1 - base, rows)
        if a0 < a1:
            w = numba.carray(address(job[o]), (rows, job[o + 2]), np.uint8)
            y = numba.carray(address(job[o + 3]), (t, rows), np.float32)
            if t == 1:
                for r in range(a0, a1):
                    y[0, r] = dot(code, w, r, xq, xd, xb, x8, xf, np.int64(0))
            else:
                _rows_tiled(code, w, a0, a1, xq, xd, xb, x8, xf, y)
        base += rows
    return 0


@njit(cache=True, nogil=True, inline="always")
def _rows_tiled(code, w, r0, r1, xq, xd, xb, x8, xf, y):
    """y[a, r] (r0 <= r < r1, every act row a of y [T, R]) by `dotn`: each weight row against
    TILE act rows a call, the tile's act rows staying in cache from row to row."""
    t = y.shape[0]
    rows = numba.carray(stack_buffer(np.int64(0)), (TILE,))
    yt = numba.carray(stack_buffer(np.float32(0)), (TILE,))
    for c0 in range(0, t, TILE):
        n = min(TILE, t - c0)
        for i in range(n):
            rows[i] = c0 + i
        for r in range(r0, r1):
            dotn(code, w, r, xq, xd, xb, x8, xf, rows, n, yt)
            for i in range(n):
                y[c0 + i, r] = yt[i]


def dense_share_address(code: int) -> int:
    """The native address of `_dense_share` for kernel `code` (compiled, or from the cache)."""
    z = np.int64(0)
    return native_address(_dense_share, (z, z, z, code, z, z), (3,))


@njit(cache=True, nogil=True, inline="always")
def run_job(ctl, fn, job, nt):
    """Job (fn, job) on the team: members 1..nt-1 and the caller's share 0."""
    jaddr = job.ctypes.data
    target = team_go(ctl, fn, jaddr, nt)
    call_job(fn, 0, nt, jaddr)
    team_join(ctl, target)


@njit(cache=True, nogil=True)
def _matmul(fn, w, y, act, job, ctl, nt):
    """y [T, R] = w [R, row bytes] against the T quantized rows of act, with share `fn`."""
    job[DJ_M], job[DJ_T] = 1, y.shape[0]
    _put(job, DJ_ACT, act[0])
    _put(job, DJ_ACT + 3, act[1])
    _put(job, DJ_ACT + 6, act[2])
    _put(job, DJ_ACT + 9, act[3])
    _put(job, DJ_ACT + 12, act[4])
    job[DJ_MAT], job[DJ_MAT + 1], job[DJ_MAT + 2] = w.ctypes.data, w.shape[0], w.shape[1]
    job[DJ_MAT + 3] = y.ctypes.data
    if w.shape[0] * w.shape[1] * y.shape[0] < DENSE_SPLIT_BYTES or nt < 2:
        call_job(fn, 0, 1, job.ctypes.data)
    else:
        run_job(ctl, fn, job, nt)


@njit(cache=True, nogil=True)
def _matmul_set(fn, t, act, job, ctl, nt):
    """The job's matrices (DJ_M of them, slots set) against the t quantized rows of act."""
    job[DJ_T] = t
    _put(job, DJ_ACT, act[0])
    _put(job, DJ_ACT + 3, act[1])
    _put(job, DJ_ACT + 6, act[2])
    _put(job, DJ_ACT + 9, act[3])
    _put(job, DJ_ACT + 12, act[4])
    nbytes = 0
    for m in range(job[DJ_M]):
        nbytes += job[DJ_MAT + 4 * m + 1] * job[DJ_MAT + 4 * m + 2] * t
    if nbytes < DENSE_SPLIT_BYTES or nt < 2:
        call_job(fn, 0, 1, job.ctypes.data)
    else:
        run_job(ctl, fn, job, nt)


def linears(lins: list, x: np.ndarray) -> list[np.ndarray]:
    """[lin(x) for lin in lins] for QuantLinears of one kernel and activation type without
    biases (q, k, v): x quantized once, the rows of every matrix one team job (split evenly
    over the threads as one range); others one call each."""
    m0 = lins[0].m
    same = all(
        type(lin) is QuantLinear
        and lin.bias is None
        and (lin.m.kernel, lin.m.act, lin.m.cols) == (m0.kernel, m0.act, m0.cols)
        for lin in lins
    )
    if not same or len(lins) > DJ_MAX:
        return [lin(x) for lin in lins]
    first = lins[0]
    x2 = np.ascontiguousarray(np.asarray(x, np.float32).reshape(-1, m0.cols))
    t = x2.shape[0]
    if not first._act or first._act[0].shape[0] < t:
        first._act = alloc_act(max(t, 1), m0.cols)
    act = tuple(a[:t] for a in first._act)
    quantize_rows(x2, m0.act, *act)
    if not first._fn:
        first._fn = dense_share_address(m0.kernel)
    ys = [np.empty((t, lin.m.rows), np.float32) for lin in lins]
    job = first._job
    job[DJ_M] = len(lins)
    for i, (lin, y) in enumerate(zip(lins, ys, strict=True)):
        o = DJ_MAT + 4 * i
        job[o : o + 4] = (lin.m.data.ctypes.data, lin.m.rows, lin.m.data.shape[1], y.ctypes.data)
    nt = numba.get_num_threads()  # the pool's count (ExpertPool sets it)
    if nt > 1 and SUPPORTED:
        team = shared_team(nt)
        with team.lock:
            _matmul_set(first._fn, t, act, job, team.ctl, nt)
    else:
        _matmul_set(first._fn, t, act, job, _SOLO, 1)
    return [y.reshape(*np.shape(x)[:-1], y.shape[1]) for y in ys]


class QuantLinear:
    """A dense weight (`.qtype`, numpy `.shape` [R, C], `.data` bytes) and optional float bias
    [R]: callable on x [T, C] -> [T, R] float32 (the host tier's `_Linear` interface)."""

    __slots__ = ("m", "bias", "vec_dot", "_fn", "_act", "_job")

    def __init__(self, t, vec_dot, bias: np.ndarray | None = None):
        r, c = (int(s) for s in t.shape)
        self.m: ExpertMatrix = prepare(t.qtype, (1, r, c), t.data)
        self.bias = None if bias is None else np.ascontiguousarray(bias, np.float32)
        self.vec_dot = vec_dot
        self._fn = 0  # `_dense_share`'s address for the kernel (compiled on first use)
        self._act: tuple = ()
        self._job = np.zeros(DJ_LEN, np.int64)

    @property
    def nbytes(self) -> int:
        return self.m.nbytes

    def __call__(self, x: np.ndarray) -> np.ndarray:
        m = self.m
        x2 = np.ascontiguousarray(np.asarray(x, np.float32).reshape(-1, m.cols))
        t = x2.shape[0]
        if not self._act or self._act[0].shape[0] < t:
            self._act = alloc_act(max(t, 1), m.cols)
        act = tuple(a[:t] for a in self._act)
        quantize_rows(x2, m.act, *act)
        y = np.empty((t, m.rows), np.float32)
        if not self._fn:
            self._fn = dense_share_address(m.kernel)
        nt = numba.get_num_threads()  # the pool's count (ExpertPool sets it)
        if nt > 1 and SUPPORTED:
            team = shared_team(nt)
            with team.lock:
                _matmul(self._fn, m.data, y, act, self._job, team.ctl, nt)
        else:
            _matmul(self._fn, m.data, y, act, self._job, _SOLO, 1)
        if self.bias is not None:
            y += self.bias
        return y.reshape(*np.shape(x)[:-1], m.rows)
