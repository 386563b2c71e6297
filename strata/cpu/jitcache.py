"""Numba's on-disk cache of strata's jitted code, dropped whenever any jitted source changes.

Numba keys a cached function by its own source file only: a kernel that inlines a helper from
another file (every kernel inlines `strata/cpu/kernels/common.py` and `simd.py`; the pool
inlines every kernel through `dispatch.dot`) keeps running the helper's old code from an
existing cache after the helper changed, on an upgraded checkout as well as in development.

`guard()` hashes every strata source that holds jitted code (`@njit` / `@intrinsic` /
`@overload`) and the Numba version; where the stamp beside a cache directory differs, that
directory's `*.nbi` / `*.nbc` files are deleted before any of them is loaded, and the new stamp
is written. Runs once
a process (from `strata.cpu`'s import, which every module whose jitted code inlines another
file's imports first); costs ~2 ms. A fresh clone has no cache: nothing to drop.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the strata package
JIT_MARKERS = (b"@njit", b"@intrinsic", b"@overload", b"@jit")
STAMP = "strata-jit-sources.sha256"


def jitted_sources(root: Path = ROOT) -> list[Path]:
    """The .py files under root that define jitted code, sorted (not this one: its docstring
    names the markers)."""
    me = Path(__file__).resolve()
    return sorted(
        p
        for p in root.rglob("*.py")
        if p.resolve() != me and any(m in p.read_bytes() for m in JIT_MARKERS)
    )


def sources_digest(files: list[Path], root: Path = ROOT) -> str:
    """One hash of the files (names and bytes) and Numba's version."""
    import numba

    h = hashlib.sha256(f"numba {numba.__version__}\n".encode())
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def cache_dir_of(src: Path) -> Path | None:
    """Where Numba keeps the cache of functions defined in `src` (its own locator classes, in
    their order: NUMBA_CACHE_DIR, the in-tree __pycache__, the user-wide directory)."""
    from numba.core import caching

    classes = getattr(caching.CacheImpl, "_locator_classes", None)
    if not classes:  # (a Numba without the attribute: the in-tree default)
        return src.parent / "__pycache__"

    def probe():  # any function: the locators read only its line number
        return None

    for cls in classes:
        try:
            loc = cls.from_function(probe, str(src))
        except Exception:  # a locator that does not apply here (IPython, zip imports)
            continue
        if loc is not None:
            return Path(loc.get_cache_path())
    return None


def drop_stale(cache_dirs: list[Path], digest: str) -> list[Path]:
    """Delete the Numba cache files of every directory whose stamp is not `digest`, then stamp
    it; returns the directories cleaned."""
    cleaned = []
    for d in cache_dirs:
        stamp = d / STAMP
        try:
            if stamp.read_text().strip() == digest:
                continue
        except OSError:
            pass  # no stamp yet: a cache from before the guard, or none
        if not d.is_dir():
            continue
        for f in d.iterdir():
            if f.suffix in (".nbi", ".nbc"):
                try:
                    f.unlink()
                except OSError:  # another process dropped it first
                    pass
        try:
            stamp.write_text(digest + "\n")
        except OSError:  # a read-only cache: Numba will not write there either
            pass
        cleaned.append(d)
    return cleaned


@functools.cache
def guard() -> list[Path]:
    """Drop strata's stale Numba caches (once a process); the directories cleaned."""
    files = jitted_sources()
    dirs = {cache_dir_of(p) for p in files}
    return drop_stale(sorted(d for d in dirs if d is not None), sources_digest(files))


def cold(src: Path = ROOT / "cpu" / "pool" / "team_job.py", name: str = "_team_share") -> bool:
    """Whether the pool's kernels were never compiled into the on-disk cache (a fresh install,
    or caches a changed source dropped): this run compiles them first (the first run only)."""
    d = cache_dir_of(src)
    return d is None or not any(d.glob(f"{src.stem}.{name}-*.nbi"))
