"""The CPU expert pool as the engine's miss runner: one pool call per layer with every miss.

T = tokens, K = picks per token, N = missed (token, expert) tasks, D = hidden, L = layers,
E = experts, R = rows of one expert matrix.

Where the expert bytes come from:
- no pack, default: the GGUF (read in place, or `prepare`'s RAM copy for repacked formats);
- a pack (`--pack DIR`): views into the pack's mmap, nothing copied at start;
- `--resident-experts`: a RAM copy of every expert the device does not hold (`skip` [L, E]).
  Each matrix keeps the kernels' [E * R, row_bytes] indexing: it is an anonymous mapping of the
  full size in which only the copied experts' pages are ever written, so the experts left out
  take no RAM (the OS backs a page only once it is touched). An expert the device later evicts
  (the adaptive cache) is copied in on its first miss.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from gguf.constants import MODEL_TENSOR as MT
from numba import njit

EXPERT_TENSORS = (MT.FFN_GATE_EXP, MT.FFN_UP_EXP, MT.FFN_DOWN_EXP)


class PoolMissRunner:
    """Adapts `strata.cpu.ExpertPool.run_layer` to the engine's `experts(layer, h, ids, w)`.

    pack: a pack directory (or an opened `strata.cpu.pack.Pack`); release: the release the pack
    must have been built for (None: not checked). resident_experts: copy the experts into RAM,
    leaving out those `skip` ([L, E] bool, the device-resident experts) marks.
    """

    name = "cpu-pool"

    def __init__(
        self,
        model,
        n_threads: int = 0,
        pack=None,
        resident_experts: bool = False,
        skip: np.ndarray | None = None,
        release: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ):
        """model: a loaded model (`.args`, `.tensor(name, layer)`); progress(done, total): the
        bytes copied into RAM so far, in resident mode."""
        from strata.cpu.pool import ExpertPool, prepare_layer

        a = model.args
        self.pool = ExpertPool(n_threads or None)
        self.pack = None
        if pack is not None:
            from strata.cpu.pack import Pack, open_pack

            self.pack = pack if isinstance(pack, Pack) else open_pack(pack, model, release=release)
        self.source = "pack" if self.pack is not None else "gguf"
        self.ram_bytes = 0  # expert bytes copied into RAM by resident mode
        if resident_experts:
            skip = np.zeros((a.n_layer, a.n_expert), bool) if skip is None else skip
            skip = np.array(skip, bool)  # a snapshot: the engine's mask changes with swaps
            if skip.shape != (a.n_layer, a.n_expert):
                raise ValueError(f"skip must be [L, E] = {[a.n_layer, a.n_expert]}")
            self.source = "ram"
            self._model = model
            self._loaded = np.zeros_like(skip)  # [L, E]: experts whose rows are in RAM
            self.layers = [self._ram_layer(i) for i in range(a.n_layer)]
            self._fill(~skip, progress)
        elif self.pack is not None:
            self.layers = self.pack.layers
        else:
            self.layers = [
                prepare_layer(*(model.tensor(m, i) for m in EXPERT_TENSORS))
                for i in range(a.n_layer)
            ]
        self.layers = [_with_model_extras(lw, model, i) for i, lw in enumerate(self.layers)]
        self.bytes_read = 0  # expert bytes the pool's kernels read (its own layout)
        self.gguf_bytes = 0  # the same experts counted in the GGUF encoding
        self._out = np.zeros((0, a.n_embd), np.float32)  # grows to the largest T
        self._tasks = (np.zeros(0, np.int32),) * 2 + (np.zeros(0, np.float32),)  # tok, ex, wt

    # ---- resident mode
    def _sources(self, layer: int):
        """The three matrices of a layer to copy from: pack matrices, or GGUF tensors."""
        if self.pack is not None:
            lw = self.pack.layers[layer]
            return (lw.gate, lw.up, lw.down)
        return tuple(self._model.tensor(m, layer) for m in EXPERT_TENSORS)

    def _ram_layer(self, layer: int):
        """A layer's matrices backed by zero-filled anonymous mappings (no RAM until written)."""
        from strata.cpu.pack import probe
        from strata.cpu.pool import LayerWeights

        mats = []
        for src in self._sources(layer):
            if self.pack is not None:  # an ExpertMatrix over the pack
                like, (e, rows, c) = src, (src.n_expert, src.rows, src.cols)
            else:  # a GGUF tensor: what `prepare` makes of it on this host
                like, (e, rows, c) = probe(src), src.shape
            b = like.data.shape[1]
            data = _anonymous(e * rows * b).reshape(e * rows, b)
            mats.append(replace(like, n_expert=e, rows=rows, cols=c, data=data))
        return LayerWeights(*mats)

    def _fill(self, want: np.ndarray, progress: Callable[[int, int], None] | None) -> None:
        """Copy the experts `want` ([L, E] bool) marks and are not yet in RAM."""
        from strata.cpu.pack import expert_rows

        todo = want & ~self._loaded
        total = sum(int(todo[i].sum()) * lw.expert_nbytes for i, lw in enumerate(self.layers))
        done = 0
        for i in np.flatnonzero(todo.any(axis=1)):
            lw = self.layers[i]
            for src, dst in zip(self._sources(i), (lw.gate, lw.up, lw.down), strict=True):
                r = dst.rows
                for e0, e1 in _runs(todo[i]):
                    rows = (
                        src.data[e0 * r : e1 * r]
                        if self.pack is not None
                        else expert_rows(src, e0, e1)
                    )
                    dst.data[e0 * r : e1 * r] = rows
                    self.ram_bytes += rows.nbytes
                    done += rows.nbytes
                    if progress is not None:
                        progress(done, total)
            self._loaded[i] |= todo[i]

    # ---- a queued decode step served in one compiled call (strata/cpu/serve.py)
    def step_server(self, recs, ready, release, y, hist):
        """A `StepServer` over this runner's layers and a queued step's pinned arrays (records
        [L, R] u32, ready [L] i32, release [1] u32, y [1, D] f32, hist [L, E] i64), or None
        where the pool cannot serve a step in one call (no resident team)."""
        from strata.cpu.serve import StepServer

        loaded = self._loaded if self.source == "ram" else None
        return StepServer.build(self.pool, self.layers, recs, ready, release, y, hist, loaded)

    def count_served(self, counts: dict) -> None:
        """Add the expert bytes a `StepServer` counted (`take_counts`) to this runner's."""
        self.bytes_read += int(counts["bytes"])
        self.gguf_bytes += int(counts["gguf_bytes"])

    # ---- the engine's call
    def experts(self, layer: int, h: np.ndarray, ids: np.ndarray, weights: np.ndarray):
        t_n = h.shape[0]
        if self._out.shape[0] < t_n:
            self._out = np.zeros((t_n, h.shape[1]), np.float32)
        out = self._out[:t_n]  # [T, D], overwritten by the pool
        if self._tasks[0].size < ids.size:
            self._tasks = (
                np.zeros(ids.size, np.int32),
                np.zeros(ids.size, np.int32),
                np.zeros(ids.size, np.float32),
            )
        n = _tasks(ids, weights, *self._tasks)  # the (t, k) picks >= 0, row-major: [N] each
        if n == 0:
            out[:] = 0.0
            return out
        tok, ex, wt = (a[:n] for a in self._tasks)
        if self.source == "ram" and not self._loaded[layer].all():
            missing = np.unique(ex[~self._loaded[layer, ex]])  # evicted from the device since
            if missing.size:
                want = np.zeros_like(self._loaded)
                want[layer, missing] = True
                self._fill(want, None)
        self.pool.run_layer(h, tok, ex, wt, self.layers[layer], out=out)
        self.bytes_read += self.pool.last_bytes
        self.gguf_bytes += self.pool.last_gguf_bytes
        return out


def _with_model_extras(lw, model, layer: int):
    """lw with the layer's expert biases and activation where the model has them (gpt-oss)."""
    from strata.cpu.pool import GLU_SILU, GLU_SWIGLU_OAI, with_extras
    from strata.quant.dequant import dequant

    a = model.args
    glu = GLU_SWIGLU_OAI if getattr(a, "ffn_act", "silu") == "swiglu_oai" else GLU_SILU
    biases = None
    if getattr(a, "expert_bias", False):
        names = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
        biases = [dequant(model.tensor(f"blk.{layer}.{n}.bias")) for n in names]
    return with_extras(lw, biases, glu)


@njit(cache=True)
def _tasks(ids, weights, tok, ex, wt):
    """The picks ids [T, K] >= 0 as tasks, row-major (np.nonzero's order): tok, ex, wt [N];
    returns N (one compiled call instead of seven NumPy ones a layer)."""
    n = 0
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            if ids[t, k] >= 0:
                tok[n] = t
                ex[n] = ids[t, k]
                wt[n] = weights[t, k]
                n += 1
    return n


def _anonymous(n: int) -> np.ndarray:
    """n zero bytes whose pages take RAM only once written (a private anonymous mapping)."""
    if hasattr(mmap, "MAP_ANONYMOUS"):
        buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return np.frombuffer(buf, np.uint8)
    return np.zeros(n, np.uint8)  # elsewhere calloc: large blocks are lazily zeroed pages too


def _runs(mask: np.ndarray):
    """(start, end) of each run of True in a 1-D mask."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True)
