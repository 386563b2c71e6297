"""A helper card: a GPU other than the primary holding expert slots, computing the picks it holds.

The primary runs the model; a helper only holds experts (slots under its own `DeviceBudget`)
and runs the resident-expert kernels (experts.cu's decode pair, the primary's) on rows sent to
it. A layer's rows travel primary -> host -> helper -> host -> primary through pinned memory:
the CPU pool needs the rows on the host anyway, and the helper's sum joins the pool's there, so
the link carries T x D floats each way (peer-to-peer copies would save the host hop; not built).
`launch` queues the upload, the kernels and the read-back on the helper's own stream and
returns at once; `collect` waits for them, so the helper computes while the pool runs its share.

Sizing: `auto` takes what the card's free memory leaves after the reserve (the budget's runtime
reserve and slack, and the workspace); N asks for N slots and is refused if they do not fit.

T = tokens, D = hidden, F = expert FFN, K = picks per token, L = layers, E = experts.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.cpu.tier import EXPERT_MATS
from strata.gpu.budget import MIB, BudgetError, DeviceBudget
from strata.gpu.decode_graph import Pinned
from strata.gpu.device import DeviceError, DeviceInfo, device_info, import_cupy
from strata.gpu.experts import SlotStore, moe_experts
from strata.gpu.norm_quant import ActBuf, norm_quant
from strata.gpu.rawmod import kernels_for
from strata.quant import fmt

QT = GGMLQuantizationType
TMAX = 32  # rows a launch (the decode kernels' chunk; a longer input runs in chunks)


def helper_budget(cp, index: int) -> DeviceBudget:
    """The current device's budget: its free memory now (its context already made), of which
    the budget's runtime reserve and slack are kept back."""
    free, _ = cp.cuda.runtime.memGetInfo()
    try:
        return DeviceBudget(total_mib=int(free // MIB), widen=True)
    except BudgetError:
        raise DeviceError(
            f"helper GPU {index}: {free / MIB:.0f} MiB free, too little for an expert cache"
        ) from None


class HelperCard:
    """Expert slots on device `info` and the kernels that compute the picks they hold."""

    def __init__(self, model, info: DeviceInfo, slots: int | str = "auto", budget=None):
        cp = self.cp = import_cupy()
        self.info, self.index = info, info.index
        a = self.args = model.args
        self.model = model
        with cp.cuda.Device(self.index):  # its kernels, pool cap and buffers live on it
            self.K = kernels_for(info)
            self.budget = budget if budget is not None else helper_budget(cp, self.index)
            self.budget.install_pool_cap(cp)
            self.slot_bytes = [
                max(model.tensor(t, i).nbytes // a.n_expert for i in range(a.n_layer))
                for t in EXPERT_MATS
            ]
            self.qtypes = [
                tuple(model.tensor(t, i).qtype for t in EXPERT_MATS) for i in range(a.n_layer)
            ]
            self._alloc_workspace()
            one = sum(self.slot_bytes)
            total = a.n_layer * a.n_expert
            n = self.budget.free_bytes // one if slots == "auto" else int(slots)
            n = min(total, int(n))
            if n < 1 or n * one > self.budget.free_bytes:
                raise DeviceError(
                    f"helper GPU {self.index}: {slots} expert slots of {one / MIB:.1f} MiB do "
                    f"not fit its {self.budget.free_bytes / MIB:.0f} MiB free\n"
                    + self.budget.table()
                )
            self.budget.reserve("expert_slots", n * one)
            self.n_slots = n
            self.stores = tuple(SlotStore(cp, n, b) for b in self.slot_bytes)
            self.stream = cp.cuda.Stream(non_blocking=True)
        self.slot_of = np.full((a.n_layer, a.n_expert), -1, np.int32)  # (layer, e) -> slot
        self._free = list(range(n - 1, -1, -1))
        self.uploads = 0
        self.hits = 0  # picks computed here
        self._pending = None  # (y, last chunk's c0 and n, event): what `collect` waits for

    def describe(self) -> str:
        return (
            f"helper {self.info.describe()}: {self.n_slots} expert slots, "
            f"budget {self.budget.total_mib} MiB"
        )

    def _alloc_workspace(self) -> None:
        cp, a = self.cp, self.args
        rows = TMAX * a.n_expert_used
        hv = {int(fmt(q[0]).vec_dot) for q in self.qtypes}  # h quantized for gate/up
        dv = {int(fmt(q[2]).vec_dot) for q in self.qtypes}  # the intermediate for down
        nbytes = sum(ActBuf.bytes_for(a.n_embd, TMAX, v) for v in hv)
        nbytes += sum(ActBuf.bytes_for(a.expert_ff, rows, v) for v in dv)
        nbytes += 4 * (2 * TMAX * a.n_embd + rows * (a.expert_ff + 2))
        self.budget.reserve("workspace", nbytes)
        self.hacts = {v: ActBuf(cp, a.n_embd, TMAX, v) for v in hv}
        self.aacts = {v: ActBuf(cp, a.expert_ff, rows, v) for v in dv}
        self.h_dev = cp.empty((TMAX, a.n_embd), np.float32)
        self.y_dev = cp.empty((TMAX, a.n_embd), np.float32)
        self.moe_act = cp.empty((rows, a.expert_ff), np.float32)
        self.pair_slot = cp.empty((rows,), np.int32)
        self.pair_w = cp.empty((rows,), np.float32)
        self.h_pin = Pinned(cp, (TMAX, a.n_embd), np.float32)
        self.y_pin = Pinned(cp, (TMAX, a.n_embd), np.float32)
        self.s_pin = Pinned(cp, (rows,), np.int32)  # the pairs' slots
        self.w_pin = Pinned(cp, (rows,), np.float32)  # and weights

    # ---- slots ----
    def load(self, mask: np.ndarray) -> None:
        """Hold exactly the experts of `mask` [L, E] (at most n_slots of them)."""
        for i, e in zip(*np.nonzero((self.slot_of >= 0) & ~mask), strict=True):
            self._drop(int(i), int(e))
        for i, e in zip(*np.nonzero(mask & (self.slot_of < 0)), strict=True):
            self._upload(int(i), int(e))

    def swap(self, layer: int, evicted: int, admitted: int) -> None:
        """The slot of `evicted` (-1: a free one) takes `admitted` (-1: none)."""
        if evicted >= 0:
            self._drop(layer, evicted)
        if admitted >= 0:
            self._upload(layer, admitted)

    def _drop(self, layer: int, e: int) -> None:
        s = int(self.slot_of[layer, e])
        if s >= 0:
            self.slot_of[layer, e] = -1
            self._free.append(s)

    def _upload(self, layer: int, e: int) -> None:
        if self.slot_of[layer, e] >= 0:
            return
        if not self._free:
            raise DeviceError(f"helper GPU {self.index}: no free slot for ({layer}, {e})")
        self.collect()  # a launch in flight may read the slot taken here
        s = self._free.pop()
        with self.cp.cuda.Device(self.index):
            for store, t in zip(self.stores, EXPERT_MATS, strict=True):
                raw = self.model.tensor(t, layer).raw()  # [E*rows, row_bytes]
                per = raw.shape[0] // self.args.n_expert
                src = np.ascontiguousarray(raw[e * per : (e + 1) * per]).reshape(-1)
                store.buf[s, : src.nbytes].set(src)
        self.slot_of[layer, e] = s
        self.uploads += 1

    # ---- compute ----
    def launch(self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> None:
        """Queue Σ_k weights · expert(h) over ids >= 0 ([T, K], every one held here) on this
        card's stream; `collect` returns it [T, D]."""
        self.collect()
        cp, a = self.cp, self.args
        ids = np.asarray(ids)
        t, k = ids.shape
        slots = np.where(ids >= 0, self.slot_of[layer][np.maximum(ids, 0)], -1)
        if ((ids >= 0) & (slots < 0)).any():
            raise DeviceError(f"helper GPU {self.index}: a pick of layer {layer} it does not hold")
        self.hits += int((ids >= 0).sum())
        w = np.ascontiguousarray(weights, dtype=np.float32)
        h = np.ascontiguousarray(h, dtype=np.float32)
        y = np.empty((t, a.n_embd), np.float32)
        qg, _, qd = self.qtypes[layer]
        hact = self.hacts[int(fmt(qg).vec_dot)]
        aact = self.aacts[int(fmt(qd).vec_dot)]
        rt, st = cp.cuda.runtime, self.stream
        up, down = rt.memcpyHostToDevice, rt.memcpyDeviceToHost
        with cp.cuda.Device(self.index), st:
            for c0 in range(0, t, TMAX):
                n = min(TMAX, t - c0)
                # a chunk at a time through the pinned buffers (a decode step: one chunk)
                self.h_pin.a[:n] = h[c0 : c0 + n]
                self.s_pin.a[: n * k] = slots[c0 : c0 + n].reshape(-1)
                self.w_pin.a[: n * k] = w[c0 : c0 + n].reshape(-1)
                for dev, pin, nb in (
                    (self.h_dev, self.h_pin, 4 * n * a.n_embd),
                    (self.pair_slot, self.s_pin, 4 * n * k),
                    (self.pair_w, self.w_pin, 4 * n * k),
                ):
                    rt.memcpyAsync(dev.data.ptr, pin.a.ctypes.data, nb, up, st.ptr)
                norm_quant(self.K, self.h_dev, n, act=hact)
                moe_experts(
                    self.K, self.qtypes[layer], (a.n_embd, a.expert_ff), self.stores, hact,
                    self.pair_slot, self.pair_w, n, k, self.moe_act, aact, self.y_dev,
                )  # fmt: skip
                nb = 4 * n * a.n_embd
                rt.memcpyAsync(self.y_pin.a.ctypes.data, self.y_dev.data.ptr, nb, down, st.ptr)
                if c0 + n < t:  # the pinned buffers are reused by the next chunk
                    st.synchronize()
                    y[c0 : c0 + n] = self.y_pin.a[:n]
            self._pending = (y, c0, n, self.stream.record())

    def collect(self) -> np.ndarray | None:
        """The last launch's result [T, D] (waits for it); None where none is in flight."""
        if self._pending is None:
            return None
        y, c0, n, ev = self._pending
        self._pending = None
        ev.synchronize()
        y[c0 : c0 + n] = self.y_pin.a[:n]
        return y


def open_helpers(model, helpers: list[tuple[int, int | str]], primary: int) -> list[HelperCard]:
    """The helper cards of `--helper-cache` (parsed), refusing the primary and unseen ordinals;
    the primary device is current again afterwards."""
    cp = import_cupy()
    if not helpers:
        return []
    if cp is None:
        raise DeviceError("--helper-cache needs CuPy and GPUs")
    count = cp.cuda.runtime.getDeviceCount()
    out = []
    for d, slots in helpers:
        if d == primary:
            raise DeviceError(f"--helper-cache: device {d} is the primary device")
        if d >= count:
            raise DeviceError(f"--helper-cache: device {d}, but only {count} are visible")
        out.append(HelperCard(model, device_info(d), slots))
    cp.cuda.Device(primary).use()
    return out
