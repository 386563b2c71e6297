"""The expert cache of a `CupyTier`: fixed VRAM slots ((layer, expert) -> slot, least recently
used out), synchronous uploads, the adaptive cache's uploads on a copy stream through pinned
memory (`prefetch`), and the staging slots that run a prompt's missed experts on the card (an
expert a prompt admits to the cache is copied there from its staging slot, on the card)."""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from strata.cpu.tier import EXPERT_MATS
from strata.gpu.budget import MIB
from strata.gpu.decode_graph import Pinned
from strata.gpu.device import DeviceError
from strata.gpu.experts import SlotStore
from strata.gpu.pairs_fast import distinct_experts
from strata.gpu.staging import StageUploader

# adaptive admits staged through pinned memory: uploads that may be in flight before the host
# waits for the oldest (a step admits a few; the card routes to one once its bytes are in)
STAGE_RING = 8


class ExpertSlots:
    """CupyTier's expert slots, uploads and staging."""

    @property
    def all_resident(self) -> bool:
        return bool((self.slot_of >= 0).all())

    # ---- expert slots ----
    def _expert_slot_bytes(self) -> list[int]:
        """Bytes of one slot per expert matrix (gate, up, down): the largest layer's expert."""
        a, m = self.args, self.model
        per = [[m.tensor(t, i).nbytes // a.n_expert for t in EXPERT_MATS] for i in range(a.n_layer)]
        return [max(p[j] for p in per) for j in range(3)]

    def _init_stage(self, n: int) -> None:
        """Staging slots for a prompt's missed experts (`experts_staged`), reserved before the
        expert cache takes what the budget leaves; 0: none (the CPU pool computes them)."""
        self.stage_n = max(0, min(int(n), self.args.n_expert))
        self.stage_stores = self._stager = None
        self.stage_uploads = 0  # experts uploaded to staging (statistics)
        self.stage_admits = 0  # of the admitted experts: copied from staging on the card
        self._link = None  # (gather, link) seconds per staged byte, measured on first ask
        if self.stage_n:
            sb = self._expert_slot_bytes()
            self.budget.reserve("prefill_stage", self.stage_n * sum(sb))
            self.stage_stores = tuple(SlotStore(self.cp, self.stage_n, b) for b in sb)

    def expert_bytes_per_layer(self) -> list[int]:
        """[L] bytes of one expert's three matrices at each layer (what one staging uploads)."""
        a, m = self.args, self.model
        return [
            sum(m.tensor(t, i).nbytes // a.n_expert for t in EXPERT_MATS) for i in range(a.n_layer)
        ]

    def stage_link(self) -> tuple[float, float]:
        """(gather, link) seconds per byte of a staged upload: the host's gather into pinned
        memory and the copy over the link, measured once (strata/gpu/link.py)."""
        if self._link is None:
            from strata.gpu.link import measure_stage_link

            self._link = measure_stage_link(self)
        return self._link

    def experts_staged(self, layer: int, h, ids: np.ndarray, weights: np.ndarray, admits=()):
        """Σ_k weights · expert(h) over ids >= 0 ([T, K]), every expert uploaded to the staging
        slots first, in groups of `stage_n` (the cache's slots stay as they are): a prompt's
        misses computed on the card instead of the CPU pool, as llama.cpp offloads a large
        batch's host-resident weights. The experts' GGUF bytes go up through pinned memory
        (strata/gpu/staging.py), one copy per matrix and group.

        admits: the adaptive cache's swaps of this layer, (evicted, admitted): an admitted
        expert among the staged ones is copied into its cache slot from its staging slot on the
        card (after its group's kernels, before the next group's upload, in the legacy stream's
        order), the others are uploaded from the host (`prefetch`)."""
        if not self.stage_n:
            raise DeviceError("experts_staged needs staging slots (prefill_stage > 0)")
        cp, a = self.cp, self.args
        hd, host = self._in(h)
        ids = np.asarray(ids)
        w = np.ascontiguousarray(weights, dtype=np.float32)
        need = np.unique(ids[ids >= 0])
        out = cp.zeros((hd.shape[0], a.n_embd), np.float32)
        tmp = cp.empty_like(out) if need.size > self.stage_n else out
        mats = [self.model.tensor(t, layer).raw() for t in EXPERT_MATS]  # [E*R, row_bytes]
        if self._stager is None:
            self._stager = StageUploader(cp, self._expert_slot_bytes(), self.stage_n)
        evict = {e: cold for cold, e in admits}  # admitted expert -> the resident it replaces
        for grp in np.array_split(need, -(-need.size // self.stage_n)) if need.size else []:
            self.await_uploads()  # an adaptive prefetch may still be in flight
            stage_of = np.full(a.n_expert, -1, np.int32)
            stage_of[grp] = np.arange(grp.size, dtype=np.int32)
            sent = self._stager.upload(self.stage_stores, mats, a.n_expert, grp)
            self.expert_bytes_uploaded += sent
            self.stage_uploads += grp.size
            slots = np.where(ids >= 0, stage_of[np.maximum(ids, 0)], -1).astype(np.int32)
            self._last_h = None
            self._experts(layer, hd, h, slots, w, tmp, stores=self.stage_stores, ids=ids)
            if tmp is not out:
                out += tmp
            if evict:
                self._admit_staged(layer, grp, evict, mats)
        for e, cold in evict.items():  # admitted, not among the staged: from the host
            self.prefetch(layer, e, cold)
        return self._out(out, host)

    def _admit_staged(self, layer: int, grp: np.ndarray, evict: dict, mats) -> None:
        """Copy the experts of `evict` in the staged group `grp` (staging slot j holds grp[j])
        into cache slots on the card, on the legacy stream (after the group's kernels and the
        layer's resident launches, which may read the evicted slots; before the next group's
        upload); popped from `evict`. Kernels on other streams wait via `await_uploads`."""
        cp = self.cp
        todo = [(j, e) for j, e in enumerate(grp.tolist()) if e in evict]
        if not todo:
            return
        null = cp.cuda.Stream.null
        if self._graph is not None:  # graph steps may still read an evicted slot
            null.wait_event(self._graph.stream.record())
        d2d = cp.cuda.runtime.memcpyDeviceToDevice
        per = [m.nbytes // self.args.n_expert for m in mats]  # bytes of one expert a matrix
        admitted = []
        for j, e in todo:
            cold = evict.pop(e)
            if self.slot_of[layer, e] >= 0:
                continue
            s = self._take_slot(layer, e, cold)
            for store, stage, n in zip(self.stores, self.stage_stores, per, strict=True):
                cp.cuda.runtime.memcpyAsync(
                    store.buf[s].data.ptr, stage.buf[j].data.ptr, n, d2d, null.ptr
                )
            admitted.append(e)
        if admitted:
            self._pending = ev = null.record()  # after the prefetches null waited for too
            self._admits.extend((layer, e, ev) for e in admitted)
            self.stage_admits += len(admitted)

    def _init_slots(self, expert_slots: int | str) -> None:
        a = self.args
        self.slot_bytes = self._expert_slot_bytes()
        one = sum(self.slot_bytes)
        total = a.n_layer * a.n_expert
        if expert_slots == "auto":
            n = min(total, self.budget.free_bytes // one)
        else:
            n = min(total, int(expert_slots))
        if n < a.n_expert_used:
            raise DeviceError(
                f"the VRAM budget leaves room for {n} expert slots, fewer than the "
                f"{a.n_expert_used} one token needs ({one / MIB:.1f} MiB each)\n"
                + self.budget.table()
            )
        self.budget.reserve("expert_slots", n * one)
        self.n_slots = int(n)
        self.stores = tuple(SlotStore(self.cp, n, b) for b in self.slot_bytes)
        self.slot_of = np.full((a.n_layer, a.n_expert), -1, np.int32)  # (layer, e) -> slot
        self._lru: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._free = list(range(n - 1, -1, -1))
        self.expert_uploads = 0
        self.expert_bytes_uploaded = 0
        self.slot_version = 0  # bumped whenever slot_of changes (the graph's slot table copy)
        self._copy = None  # the copy stream of `prefetch` (made on first use)
        self._pending = None  # the last prefetch's event
        self._admits: deque = deque()  # (layer, e, its upload's event) of uploads maybe in flight
        if n == total:  # everything fits: load it all now, no upload on the hot path
            for i in range(a.n_layer):
                for e in range(a.n_expert):
                    self._upload(i, e)

    def resident_mask(self, layer: int) -> np.ndarray:
        """[E] bool: experts of `layer` in a VRAM slot now (for cache-aware routing)."""
        return self.slot_of[layer] >= 0

    def load_resident(self, mask: np.ndarray) -> np.ndarray:
        """Fill the slots with the experts of `mask` [L, E] (a placement from the usage
        profile), in order, up to the slot count; returns the resident mask [L, E] after."""
        for key in [k for k in self._lru if not mask[k]]:  # a re-placement: unwanted out
            self._free.append(self._lru.pop(key))
            self.slot_of[key] = -1
            self.slot_version += 1
        for i, e in zip(*np.nonzero(mask), strict=True):
            if self.slot_of[i, e] < 0 and (self._free or len(self._lru) >= self.n_slots):
                if not self._free and bool(mask[self._lru_oldest()]):
                    break  # every slot already holds a wanted expert
                self._upload(int(i), int(e))
        return self.slot_of >= 0

    def _lru_oldest(self) -> tuple[int, int]:
        return next(iter(self._lru))

    def _upload(self, layer: int, e: int, keep: frozenset = frozenset()) -> int:
        self.await_uploads()  # a prefetch still copying into the slot taken here goes first
        if self._free:
            s = self._free.pop()
        else:
            for key in self._lru:  # least recently used first
                if key[0] != layer or key[1] not in keep:
                    break
            else:
                raise DeviceError("expert cache too small for one layer's picks")
            s = self._lru.pop(key)
            self.slot_of[key] = -1
        for j, t in enumerate(EXPERT_MATS):
            raw = self.model.tensor(t, layer).raw()  # [E*rows, row_bytes]
            per = raw.shape[0] // self.args.n_expert
            src = np.ascontiguousarray(raw[e * per : (e + 1) * per]).reshape(-1)
            self.stores[j].buf[s, : src.nbytes].set(src)
            self.expert_bytes_uploaded += src.nbytes
        self.expert_uploads += 1
        self.slot_of[layer, e] = s
        self._lru[(layer, e)] = s
        self.slot_version += 1
        return s

    def prefetch(self, layer: int, e: int, evict: int | None = None) -> None:
        """Upload expert (layer, e) without blocking the compute streams (adaptive admits):
        staged through pinned memory and copied on a copy stream once the work already queued
        (which may still read the evicted slot) is done; kernels launched later wait for it
        (`await_uploads`). `evict` names the expert of `layer` whose slot it takes."""
        if self.slot_of[layer, e] >= 0:
            return
        cp = self.cp
        s = self._take_slot(layer, e, evict)
        self.copy_stream()
        for st in (cp.cuda.Stream.null, self._graph.stream if self._graph else None):
            if st is not None:
                self._copy.wait_event(st.record())
        j = self.expert_uploads % STAGE_RING
        if self._stage_ev[j] is not None:
            self._stage_ev[j].synchronize()  # the staging buffer's last copy has left it
        buf, off = self._stage[j].a, 0
        for m, t in enumerate(EXPERT_MATS):
            raw = self.model.tensor(t, layer).raw()  # [E*rows, row_bytes]
            per = raw.shape[0] // self.args.n_expert
            src = raw[e * per : (e + 1) * per].reshape(-1)
            buf[off : off + src.nbytes] = src
            cp.cuda.runtime.memcpyAsync(
                self.stores[m].buf[s].data.ptr,
                buf[off:].ctypes.data,
                src.nbytes,
                cp.cuda.runtime.memcpyHostToDevice,
                self._copy.ptr,
            )
            off += src.nbytes
            self.expert_bytes_uploaded += src.nbytes
        self._stage_ev[j] = self._pending = self._copy.record()
        self._admits.append((layer, e, self._pending))
        self.expert_uploads += 1

    def _take_slot(self, layer: int, e: int, evict: int | None) -> int:
        """The slot expert (layer, e) is admitted to (the slot of `evict`, an expert of `layer`,
        where it is resident; else a free one; else the least recently used), the table updated
        (the bytes are the caller's to copy)."""
        if evict is not None and self.slot_of[layer, evict] >= 0:
            key = (layer, int(evict))
        elif self._free:
            key = None
        else:
            key = next(iter(self._lru))
        s = self._free.pop() if key is None else self._lru.pop(key)
        if key is not None:
            self.slot_of[key] = -1
        self.slot_of[layer, e] = s
        self._lru[(layer, e)] = s
        self.slot_version += 1
        return s

    def copy_stream(self):
        """The stream of `prefetch`'s uploads (made, with its pinned staging, on first use)."""
        if self._copy is None:
            cp = self.cp
            self._copy = cp.cuda.Stream(non_blocking=True)
            n = sum(self.slot_bytes)
            self._stage = [Pinned(cp, (n,), np.uint8) for _ in range(STAGE_RING)]
            self._stage_ev = [None] * STAGE_RING
        return self._copy

    def await_uploads(self, stream=None) -> None:
        """Make `stream` (default: the legacy stream) wait for the prefetches issued so far."""
        ev = self._pending
        if ev is not None:
            (stream or self.cp.cuda.Stream.null).wait_event(ev)
            if ev.done:
                self._pending = None
                self._admits.clear()

    def settled_slots(self) -> tuple[np.ndarray, bool]:
        """The slot table [L, E] with the experts whose uploads are still in flight left out
        (-1), and whether there are any: what a step may read without waiting for the copy
        stream (the graph decoder's routed step admits an expert once its bytes are in)."""
        adm = self._admits
        while adm and adm[0][2].done:  # one copy stream: its events complete in order
            adm.popleft()
        if not adm:
            return self.slot_of, False
        tab = self.slot_of.copy()
        for layer, e, _ in adm:
            tab[layer, e] = -1
        return tab, True

    def sync_uploads(self) -> None:
        """Wait for expert uploads (legacy stream) before another stream reads the slots."""
        self.cp.cuda.Stream.null.synchronize()

    def slots_for(self, layer: int, ids: np.ndarray) -> np.ndarray:
        """Slots of ids [T, K] (uploading missing experts); -1 where ids < 0."""
        need = distinct_experts(ids, self.args.n_expert).tolist()  # ascending
        keep = frozenset(need)
        row = self.slot_of[layer]
        for e in need:
            if row[e] < 0:
                self._upload(layer, e, keep)
            else:
                self._lru.move_to_end((layer, e))
        return np.where(ids >= 0, row[np.maximum(ids, 0)], -1).astype(np.int32)
