"""A fake CuPy for CPU-only development: numpy arrays + RawModule kernels run by the emu fiber
runtime (g++). Strict about kernel argument types (checks against the parsed C signature)."""

import ctypes as _ct
import hashlib as _hl
import os as _os
import re as _re
import subprocess as _sp

import numpy as _np
from numpy import *  # noqa: F403 (the fake is numpy with a few additions)

__emulated__ = True  # kernels run to completion at launch (strata.gpu.decode_graph reads this)

from . import cuda  # noqa
from .cuda import memory as _mem  # noqa

_EMU_DIR = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
# compiled kernels, keyed by a hash of their source, emu.h and the defines (safe to share)
_BUILD = _os.environ.get("EMU_BUILD") or _os.path.join(
    _os.path.expanduser("~"), ".cache", "strata-gpu-emu"
)
_os.makedirs(_BUILD, exist_ok=True)


class _Data:
    def __init__(self, a):
        self.ptr = a.ctypes.data


class ndarray(_np.ndarray):
    """A device array: NumPy memory tagged with the device current when it was made (views
    keep their base's); a kernel refuses an array of another device."""

    def __array_finalize__(self, obj):
        self.device_id = getattr(obj, "device_id", cuda.runtime._current)

    @property
    def device(self):
        return cuda.Device(self.device_id)

    @property
    def data(self):
        return _Data(self)

    def get(self, stream=None, out=None):
        if out is not None:
            out[...] = _np.asarray(self)
            return out
        return _np.array(self).view(_np.ndarray)

    def set(self, arr, stream=None):
        a = _np.asarray(arr)
        assert a.nbytes == self.nbytes, (a.shape, self.shape)
        _np.asarray(self).view(_np.uint8).reshape(-1)[:] = (
            _np.ascontiguousarray(a).view(_np.uint8).reshape(-1)
        )

    def copy(self, order="C"):
        return _np.array(self, order=order).view(ndarray)


def _wrap(a):
    v = a.view(ndarray)
    v.device_id = cuda.runtime._current
    return _account(v)


def _account(a):
    alloc = _mem._allocator
    if alloc is not None and a.nbytes:
        alloc(a.nbytes)
        import weakref

        pool = get_default_memory_pool()
        n, dev = a.nbytes, cuda.runtime._current
        weakref.finalize(a, lambda: pool.release(dev, n))
    return a


def empty(shape, dtype=_np.float32, order="C"):
    a = _np.empty(shape, dtype)
    if _np.issubdtype(a.dtype, _np.floating):
        a.fill(_np.nan)  # poison: unwritten outputs show
    else:
        a.fill(-77 if _np.issubdtype(a.dtype, _np.signedinteger) else 77)
    return _wrap(a)


def zeros(shape, dtype=_np.float32, order="C"):
    return _wrap(_np.zeros(shape, dtype))


def ones(shape, dtype=_np.float32):
    return _wrap(_np.ones(shape, dtype))


def full(shape, v, dtype=None):
    return _wrap(_np.full(shape, v, dtype))


def arange(*a, **k):
    return _wrap(_np.arange(*a, **k))


def asarray(a, dtype=None):
    return _wrap(_np.array(a, dtype=dtype, copy=True))


def array(a, dtype=None, copy=True):
    return _wrap(_np.array(a, dtype=dtype, copy=True))


def ascontiguousarray(a, dtype=None):
    return _wrap(_np.ascontiguousarray(a, dtype=dtype))


def empty_like(a, dtype=None):
    return empty(a.shape, dtype or a.dtype)


def zeros_like(a, dtype=None):
    return zeros(a.shape, dtype or a.dtype)


def asnumpy(a, stream=None):
    return _np.array(a).view(_np.ndarray)


_POOL = None


def get_default_memory_pool():
    global _POOL
    if _POOL is None:
        _POOL = _mem.MemoryPool()
    return _POOL


def get_default_pinned_memory_pool():
    return _mem.PinnedMemoryPool()


# ---- RawModule through g++ + emu.h ----
# a __launch_bounds__(...) whose argument may hold parentheses two deep
_BOUNDS = r"__launch_bounds__\((?:[^()]|\([^()]*(?:\([^()]*\)[^()]*)*\))*\)\s*"
_SIG = _re.compile(
    r'extern\s+"C"\s+__global__\s+(?:' + _BOUNDS + r")?void\s+(?:" + _BOUNDS + r")?"
    r"(\w+)\s*\(([^)]*)\)",
    _re.S,
)
_PTR_DT = {
    "float": _np.float32,
    "double": _np.float64,
    "i8": _np.int8,
    "u8": _np.uint8,
    "u16": _np.uint16,
    "i16": _np.int16,
    "i32": _np.int32,
    "int": _np.int32,
    "u32": _np.uint32,
    "i64": _np.int64,
    "u64": _np.uint64,
    "void": None,
}
_SCAL = {
    "float": (_ct.c_float, _np.float32),
    "double": (_ct.c_double, _np.float64),
    "int": (_ct.c_int32, _np.int32),
    "i32": (_ct.c_int32, _np.int32),
    "unsigned": (_ct.c_uint32, _np.uint32),
    "u32": (_ct.c_uint32, _np.uint32),
    "i64": (_ct.c_int64, _np.int64),
    "long long": (_ct.c_int64, _np.int64),
    "u64": (_ct.c_uint64, _np.uint64),
}


def _parse_params(s):
    out = []
    for p in [x.strip() for x in s.split(",") if x.strip()]:
        p = p.replace("__restrict__", "").replace("const ", "").strip()
        m = _re.match(r"(.*?)(\**)\s*(\w+)$", p)
        base, stars, name = m.group(1).strip(), m.group(2), m.group(3)
        if "*" in base:
            stars += "*" * base.count("*")
            base = base.replace("*", "").strip()
        out.append((base, bool(stars), name))
    return out


class RawModule:
    def __init__(self, code=None, options=(), name_expressions=None, backend="nvrtc", path=None):
        self.code = code
        defs = [o for o in options if o.startswith("-D") or o.startswith("-I")]
        warp = 32
        for o in defs:
            if o.startswith("-DWARP_SIZE="):
                warp = int(o.split("=")[1])
        self.kernels = {}
        wrappers = []
        pre = _sp.run(
            ["g++", "-E", "-P", "-x", "c++", "-DGPU_EMU", *defs, "-"],
            input=code,
            capture_output=True,
            text=True,
        )
        if pre.returncode:
            raise cuda.compiler.CompileException(pre.stderr[-4000:])
        for name, params in _SIG.findall(pre.stdout):
            ps = _parse_params(params)
            self.kernels[name] = ps
            decl = ", ".join(f"{b}{'*' if ptr else ''} {n}" for b, ptr, n in ps)
            args = ", ".join(n for _, _, n in ps)
            wrappers.append(
                f'extern "C" int __emu_{name}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, '
                f"unsigned by, unsigned bz{', ' if decl else ''}{decl}) {{ "
                f"return emu::launch(dim3(gx, gy, gz), "
                f"dim3(bx, by, bz), [=]() {{ {name}({args}); }}); }}"
            )
        src = code + "\n" + "\n".join(wrappers) + "\n"
        # a kernel's __shared__ arrays are function-local statics here, and g++ makes those of
        # inline functions and templates process-wide (STB_GNU_UNIQUE): two builds of one source
        # with different -D knobs (and so different array sizes) would share one array, sized by
        # whichever loaded first. Each build keeps its own.
        link = ["-fno-gnu-unique", "-Wl,-Bsymbolic"]
        h = _hl.sha1(
            (src + repr(defs) + repr(link) + open(_os.path.join(_EMU_DIR, "emu.h")).read()).encode()
        ).hexdigest()[:16]
        so = _os.path.join(_BUILD, f"k_{h}.so")
        if not _os.path.exists(so):
            cu = _os.path.join(_BUILD, f"k_{h}.cpp")
            with open(cu, "w") as f:
                f.write(src)
            cmd = [
                "g++",
                "-O1",
                "-g",
                "-std=c++17",
                "-shared",
                "-fPIC",
                "-w",
                *link,
                f"-DEMU_WARP={warp}",
                "-include",
                _os.path.join(_EMU_DIR, "emu.h"),
                *defs,
                cu,
                "-o",
                so + ".tmp",
            ]
            r = _sp.run(cmd, capture_output=True, text=True)
            if r.returncode:
                raise cuda.compiler.CompileException(r.stderr[-6000:])
            _os.replace(so + ".tmp", so)
        self.lib = _ct.CDLL(so)

    def get_function(self, name):
        if name not in self.kernels:
            raise KeyError(name)
        return _Kernel(self, name, self.kernels[name])


class _Kernel:
    def __init__(self, mod, name, params):
        self.name, self.params = name, params
        self.fn = getattr(mod.lib, f"__emu_{name}")
        self.fn.restype = _ct.c_int

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        if len(args) != len(self.params):
            raise TypeError(f"{self.name}: {len(args)} args for {len(self.params)} params")
        cargs = []
        for a, (base, ptr, pname) in zip(args, self.params, strict=True):
            if ptr:
                if isinstance(a, _np.ndarray):
                    dev = getattr(a, "device_id", None)
                    if dev is not None and dev != cuda.runtime._current:
                        raise ValueError(
                            f"{self.name}.{pname}: an array of device {dev} in a kernel "
                            f"launched on device {cuda.runtime._current}"
                        )
                    want = _PTR_DT.get(base, "?")
                    if want is not None and want != "?" and a.dtype != want:
                        raise TypeError(f"{self.name}.{pname}: array dtype {a.dtype} for {base}*")
                    if not (a.flags.c_contiguous or a.size <= 1):
                        raise TypeError(f"{self.name}.{pname}: non-contiguous array")
                    cargs.append(_ct.c_void_p(a.ctypes.data))
                elif isinstance(a, _np.uint64):  # NULL, or a pinned host address
                    cargs.append(_ct.c_void_p(int(a)))
                else:
                    raise TypeError(f"{self.name}.{pname}: {type(a)} for pointer {base}*")
            else:
                ct_, nt = _SCAL[base]
                if type(a) is not nt:
                    raise TypeError(
                        f"{self.name}.{pname}: {type(a).__name__} for {base} (want {nt.__name__})"
                    )
                cargs.append(ct_(a))
        rc = self.fn(*[_ct.c_uint(int(v)) for v in grid + block], *cargs)
        if rc:
            raise RuntimeError(f"emu: kernel {self.name} failed ({rc})")
