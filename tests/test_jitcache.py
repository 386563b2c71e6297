"""strata.cpu.jitcache: Numba caches dropped when a jitted source changes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from strata.cpu import jitcache
from strata.cpu.jitcache import STAMP, drop_stale, jitted_sources, sources_digest


def test_jitted_sources_are_the_files_with_jitted_code():
    names = {p.relative_to(jitcache.ROOT).as_posix() for p in jitted_sources()}
    assert {"cpu/pool/phases.py", "cpu/kernels/common.py", "cpu/kernels/simd.py"} <= names
    assert "cpu/pack.py" not in names  # no jitted code there
    assert "cpu/jitcache.py" not in names  # (its docstring names the markers)


def test_digest_follows_every_source_byte(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    d0 = sources_digest([a, b], tmp_path)
    assert sources_digest([a, b], tmp_path) == d0
    b.write_text("y = 3\n")
    d1 = sources_digest([a, b], tmp_path)
    assert d1 != d0


def test_drop_stale_clears_only_directories_with_another_stamp(tmp_path):
    stale, fresh, bare = tmp_path / "stale", tmp_path / "fresh", tmp_path / "bare"
    for d in (stale, fresh, bare):
        d.mkdir()
        for name in ("m.f-1.py311.nbi", "m.f-1.py311.1.nbc", "m.cpython-311.pyc"):
            (d / name).write_bytes(b"x")
    (stale / STAMP).write_text("old\n")
    (fresh / STAMP).write_text("new\n")
    assert drop_stale([stale, fresh, bare, tmp_path / "absent"], "new") == [stale, bare]
    for d in (stale, bare):  # Numba's files gone, Python's kept, the new stamp written
        assert sorted(p.name for p in d.iterdir()) == ["m.cpython-311.pyc", STAMP]
        assert (d / STAMP).read_text().strip() == "new"
    assert len(list(fresh.iterdir())) == 4
    assert drop_stale([stale, fresh, bare], "new") == []  # stamped: nothing to do


_PROBE = """
import sys
sys.path.insert(0, {pkg!r})
if {guard}:
    from pathlib import Path
    from strata.cpu.jitcache import drop_stale, jitted_sources, sources_digest
    root = Path({pkg!r})
    files = jitted_sources(root)
    drop_stale([root / "__pycache__"], sources_digest(files, root))
import a
print(a.f())
"""


def _run(pkg: Path, guard: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    code = _PROBE.format(pkg=str(pkg), guard=guard)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_changed_inlined_helper_is_stale_in_numbas_cache_and_fresh_with_the_guard(tmp_path):
    """The failure the guard exists for: a cached function keeps a helper's old code after the
    helper's file changed (Numba checks the function's own file only); with the guard the
    change is seen."""
    (tmp_path / "a.py").write_text(
        textwrap.dedent("""
        from numba import njit
        from b import g

        @njit(cache=True)
        def f():
            return g() + 1
        """)
    )
    helper = textwrap.dedent("""
        from numba import njit

        @njit(cache=True)
        def g():
            return {v}
        """)
    (tmp_path / "b.py").write_text(helper.format(v=10))
    assert _run(tmp_path, guard=False) == "11"
    (tmp_path / "b.py").write_text(helper.format(v=20))
    assert _run(tmp_path, guard=False) == "11"  # Numba alone: the old helper, from the cache
    assert _run(tmp_path, guard=True) == "21"
    assert _run(tmp_path, guard=True) == "21"  # (stamped: the new cache is kept and used)


def test_cold_until_the_pools_share_is_in_the_cache(tmp_path):
    src = tmp_path / "team_job.py"
    src.write_text("x = 1\n")
    cache = tmp_path / "__pycache__"
    assert jitcache.cold(src)  # a fresh install: no cache directory yet
    cache.mkdir(exist_ok=True)  # (the locator may have made it)
    (cache / "team_job._team_share-102.py311.nbi").write_bytes(b"")
    assert not jitcache.cold(src)
