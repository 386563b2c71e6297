"""Compiled kernel modules of one device, built on first use (`cupy.RawModule`).

Every source is compiled with `-DWARP_SIZE=<the device's warp size>` and nothing else; nothing
in the kernels hard-codes 32. CuPy caches the compiled binaries on disk, so a second process
starts fast.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from strata.gpu import pdl
from strata.gpu.source import expand

NULL = np.uint64(0)  # a null pointer argument


def i32(v) -> np.int32:
    return np.int32(v)


def i64(v) -> np.int64:
    return np.int64(v)


def f32(v) -> np.float32:
    return np.float32(v)


def ptr(a):
    """A device array, or NULL for None (kernels treat null pointers as 'absent')."""
    return NULL if a is None else a


def host_ptr(a: np.ndarray) -> np.uint64:
    """A pinned host array as a kernel pointer (unified addressing: the host address is the
    device's)."""
    return np.uint64(a.ctypes.data)


class Kernel:
    """One kernel of a module, called as CuPy's: `k(grid, block, args)`. Inside the owner's
    `pdl_scope()` it goes out with programmatic dependent launch (pdl.py)."""

    __slots__ = ("f", "owner")

    def __init__(self, f, owner: Kernels):
        self.f, self.owner = f, owner

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        o = self.owner
        if o.pdl is not None:
            o.pdl(self.f, grid, block, args, shared_mem)
        else:
            self.f(grid, block, args, shared_mem=shared_mem)


class Kernels:
    """The RawModules of one device; `fn(source, name)` returns a launchable `Kernel`."""

    def __init__(self, cp, warp_size: int, sm_count: int = 1, arch: str = ""):
        self.cp = cp
        self.warp = int(warp_size)
        self.sm_count = int(sm_count)
        self._mods: dict[str, object] = {}
        self._fns: dict[tuple, Kernel] = {}
        self._token_tiles: dict[tuple[int, int], tuple] = {}
        self.arch = arch
        self.pdl = None  # the PDL launcher while a pdl_scope is open
        self._pdl_launcher = None
        if arch and pdl.supported(cp, arch):
            self._pdl_launcher = pdl.Launcher(cp)

    def token_tiles(self, t: int, nt: int):
        """Device int32 arrays (slot, first, n, order) tiling tokens 0..t-1 in runs of nt, all
        in slot 0: the tiles of a dense GEMM on the MoE tile kernels (made once per (t, nt))."""
        key = (int(t), int(nt))
        tiles = self._token_tiles.get(key)
        if tiles is None:
            first = np.arange(0, t, nt, dtype=np.int32)
            n = np.minimum(nt, t - first).astype(np.int32)
            cp = self.cp
            tiles = (cp.zeros(first.size, np.int32), cp.asarray(first), cp.asarray(n),
                     cp.arange(t, dtype=np.int32))  # fmt: skip
            self._token_tiles[key] = tiles
        return tiles

    @property
    def int8_mma(self) -> bool:
        """Whether the device has the int8 tensor-core mma (m16n8k16 s8) that experts_mma.cu
        uses: CUDA sm_80 or newer (not HIP, not the emulator)."""
        cp = self.cp
        if getattr(cp, "__emulated__", False) or getattr(cp.cuda.runtime, "is_hip", False):
            return False
        a = self.arch
        return a.startswith("sm_") and a[3:].isdigit() and int(a[3:]) >= 80

    @property
    def pdl_available(self) -> bool:
        return self._pdl_launcher is not None

    @contextmanager
    def pdl_scope(self):
        """Launches inside go out with programmatic dependent launch where the device has it."""
        prev, self.pdl = self.pdl, self._pdl_launcher
        try:
            yield
        finally:
            self.pdl = prev

    def options(self) -> tuple[str, ...]:
        return (f"-DWARP_SIZE={self.warp}",)

    def module(self, source: str):
        m = self._mods.get(source)
        if m is None:
            m = self.cp.RawModule(code=expand(source), options=self.options())
            self._mods[source] = m
        return m

    def fn(self, source: str, name: str):
        key = (source, name)
        f = self._fns.get(key)
        if f is None:
            f = Kernel(self.module(source).get_function(name), self)
            self._fns[key] = f
        return f

    def warps_per_block(self, threads: int = 128) -> int:
        return max(1, threads // self.warp)


_by_device: dict[int, Kernels] = {}


def kernels_for(info) -> Kernels:
    """The shared `Kernels` of a `DeviceInfo` (one per device ordinal)."""
    k = _by_device.get(info.index)
    if k is None:
        from strata.gpu.device import import_cupy

        k = Kernels(import_cupy(), info.warp_size, info.sm_count, arch=info.arch)
        _by_device[info.index] = k
    return k
