"""Programmatic dependent launch (PDL): a kernel starts while the one before it still runs.

On NVIDIA sm_90+ a kernel launched with the programmatic-stream-serialization attribute may be
scheduled as soon as every block of the kernel before it in the stream has passed
`griddepcontrol.launch_dependents`; its own `griddepcontrol.wait` then holds it until that kernel
has completed and its writes are visible. A decode step is a chain of ~600 small launches, each
paying the launch and block-scheduling latency once: with PDL the next kernel's blocks are already
resident when the previous one ends.

The kernels' side is `PDL_ENTER()` (common.cuh), the first statement of every kernel: wait,
then allow the next kernel in. Waiting before anything else (no early return before it) keeps
the order transitive: a kernel cannot complete before the kernel it waits on, so a later kernel
that reads an older kernel's output is still ordered after it. Off sm_90 (and on HIP) the macro
is empty and a kernel launched without the attribute passes the wait at once.

The host side: CuPy launches through cuLaunchKernel, without attributes, so `launch` calls the
driver's cuLaunchKernelEx through ctypes with the kernel's CUfunction. `Kernels` (rawmod.py) takes
this path only inside `pdl_scope()`, which the graph decoder opens while it captures a step
(CUDA >= 12.3 records the programmatic edges in the graph); eager launches keep CuPy's path.
"""

from __future__ import annotations

import ctypes

import numpy as np

ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # cuda.h CUlaunchAttributeID
MIN_DRIVER = 12030  # graphs keep programmatic edges from stream capture since CUDA 12.3


class _Attr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("value", ctypes.c_int32 * 16)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint32 * 3),
        ("block", ctypes.c_uint32 * 3),
        ("shared_mem", ctypes.c_uint32),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attr)),
        ("n_attrs", ctypes.c_uint32),
    ]


def supported(cp, arch: str) -> bool:
    """PDL on this device: CUDA (not HIP), sm_90 or newer, a driver >= 12.3."""
    if getattr(cp.cuda.runtime, "is_hip", False) or not arch.startswith("sm_"):
        return False
    try:
        return int(arch[3:]) >= 90 and cp.cuda.runtime.driverGetVersion() >= MIN_DRIVER
    except (ValueError, AttributeError):
        return False


class Launcher:
    """cuLaunchKernelEx with the PDL attribute, for CuPy's RawKernels (`.kernel.ptr`: the
    CUfunction)."""

    def __init__(self, cp):
        self.cp = cp
        lib = ctypes.CDLL("libcuda.so.1")
        self._launch = lib.cuLaunchKernelEx
        self._launch.argtypes = [
            ctypes.POINTER(_Config),
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
        ]
        self._launch.restype = ctypes.c_int
        self._err_name = lib.cuGetErrorName
        self._err_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._attrs = self.pdl_attrs()

    @staticmethod
    def pdl_attrs():
        """The launch attribute list: programmaticStreamSerializationAllowed = 1."""
        arr = (_Attr * 1)()
        arr[0].id = ATTR_PROGRAMMATIC_STREAM_SERIALIZATION
        arr[0].value[0] = 1
        return arr

    @staticmethod
    def _param(a) -> np.ndarray:
        """The bytes of one kernel argument as CuPy would pass it (the driver copies as many as
        the kernel's parameter holds): device arrays by pointer, NumPy scalars as they are,
        Python ints as int64, floats as float64, None as a null pointer."""
        if a is None:
            return np.zeros((), np.uint64)
        data = getattr(a, "data", None)
        if data is not None and hasattr(data, "ptr"):
            return np.array(data.ptr, np.uint64)
        if isinstance(a, np.generic):
            return np.array(a)
        if isinstance(a, bool):
            return np.array(a, np.bool_)
        if isinstance(a, int):
            return np.array(a, np.int64)
        if isinstance(a, float):
            return np.array(a, np.float64)
        raise TypeError(f"kernel argument of type {type(a).__name__} (PDL launch)")

    def _check(self, rc: int, what: str) -> None:
        if rc:
            name = ctypes.c_char_p()
            self._err_name(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {(name.value or b'?').decode()} ({rc})")

    def __call__(self, fn, grid, block, args, shared_mem: int = 0) -> None:
        """Launch fn with the PDL attribute."""
        vals = [self._param(a) for a in args]  # alive until the call returns
        ptrs = (ctypes.c_void_p * max(1, len(vals)))(*[v.ctypes.data for v in vals])
        g = tuple(grid) + (1,) * (3 - len(grid))
        b = tuple(block) + (1,) * (3 - len(block))
        cfg = _Config(
            grid=(ctypes.c_uint32 * 3)(*g),
            block=(ctypes.c_uint32 * 3)(*b),
            shared_mem=shared_mem,
            stream=self.cp.cuda.get_current_stream().ptr,
            attrs=ctypes.cast(self._attrs, ctypes.POINTER(_Attr)),
            n_attrs=1,
        )
        rc = self._launch(ctypes.byref(cfg), fn.kernel.ptr, ptrs, None)
        self._check(rc, "cuLaunchKernelEx (PDL)")
