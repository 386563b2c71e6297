"""The pool's decode layer on expert bytes held in different kinds of memory, calls interleaved.

The engine's experts sit in one of: a NumPy array (`prepare`'s RAM copy of a repacked format;
NumPy asks the kernel for transparent huge pages on large arrays), the GGUF's or a pack's file
mapping (page cache, 4 KiB pages), or `--resident-experts`' anonymous mapping. The arms here
hold the same layer's bytes (copies past twice the LLC each, as `layer_copies`) as:

  numpy    ndarray.copy()
  anon4k   an anonymous mapping with MADV_NOHUGEPAGE (4 KiB pages)
  anonthp  an anonymous mapping, 2 MiB-aligned, with MADV_HUGEPAGE
  file     a read-only np.memmap of a file written in --dir (page cache; read once first)

and time `ExpertPool.run_layer` at T = 1 in ABBA order on the same routings. Per arm: median /
best ms a layer, GB/s of GGUF bytes, the arm's own read bandwidth (`read_bandwidth` over its
pages) and the huge-page bytes the process gained when the arm was built (smaps_rollup).

    PYTHONPATH=. python bench/cpu_page_ab.py --quant IQ3_XXS,IQ1_M --threads 16 [--json F]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import tempfile
import time

import numba
import numpy as np

from strata.bench.cpu_pool import SHAPES, _commit, _route_seq, layer_copies, machine, make_layer
from strata.cpu.bandwidth import host_read_bandwidth, read_bandwidth
from strata.cpu.pool import ExpertPool

HUGE = 2 << 20
ARMS = ("numpy", "anon4k", "anonthp", "file")


def _huge_kib() -> int:
    """AnonHugePages of this process (KiB; 0 where smaps_rollup is missing)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Backing:
    """Makes arrays of one memory kind (keeps the mappings and files alive)."""

    def __init__(self, kind: str, directory: str):
        if kind not in ARMS:
            raise ValueError(f"unknown memory kind {kind!r} (known: {', '.join(ARMS)})")
        self.kind, self.dir, self.keep = kind, directory, []

    def __call__(self, a: np.ndarray) -> np.ndarray:
        if self.kind == "numpy":
            return a.copy()
        if self.kind == "file":
            fd, path = tempfile.mkstemp(prefix="strata-page-ab-", dir=self.dir)
            os.close(fd)
            a.tofile(path)
            m = np.memmap(path, np.uint8, "r", shape=a.shape)
            os.unlink(path)  # the mapping keeps the pages; nothing is left behind
            int(m.reshape(-1)[:: mmap.PAGESIZE].sum())  # every page in the page cache, mapped
            self.keep.append(m)
            return m
        n = a.nbytes
        buf = mmap.mmap(-1, n + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.keep.append(buf)
        base = np.frombuffer(buf, np.uint8)
        off = (-base.ctypes.data) % HUGE if self.kind == "anonthp" else 0
        advice = mmap.MADV_HUGEPAGE if self.kind == "anonthp" else mmap.MADV_NOHUGEPAGE
        buf.madvise(advice)
        out = base[off : off + n].reshape(a.shape)
        out[...] = a
        return out


def run(shape: str, quant: str, threads: int, repeats: int, arms, directory: str) -> list[dict]:
    s = SHAPES[shape]
    k, d = s["n_expert_used"], s["n_embd"]
    lw = make_layer(shape, quant)
    layers, huge = {}, {}
    for a in arms:
        h0 = _huge_kib()
        layers[a] = layer_copies(lw, copy=Backing(a, directory))
        huge[a] = (_huge_kib() - h0) * 1024
    pool = ExpertPool(threads)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, d)).astype(np.float32)
    routes = _route_seq(rng, repeats, 1, s["n_expert"], k)
    for a in arms:
        pool.run_layer(x, *routes[0], layers[a][-1])  # compile (read-only maps type apart)
    times = {a: [] for a in arms}
    gb = {a: [] for a in arms}
    c = 0
    for i, r in enumerate(routes):
        for a in arms if i % 2 == 0 else arms[::-1]:
            lws = layers[a]
            t0 = time.perf_counter()
            pool.run_layer(x, *r, lws[c % len(lws)])
            times[a].append(time.perf_counter() - t0)
            gb[a].append(pool.last_gguf_bytes)
        c += 1
    time.sleep(0.05)  # the team's members asleep before the reads
    host = host_read_bandwidth(threads)
    rows = []
    for a in arms:
        own = read_bandwidth([m.data for x in layers[a] for m in (x.gate, x.up, x.down)], threads)
        sec = float(np.median(times[a]))
        g = float(np.mean(gb[a])) / sec / 1e9
        rows.append(
            {
                "shape": shape, "quant": quant, "memory": a, "threads": threads,
                "layout": lw.gate.layout, "seconds": sec, "seconds_best": min(times[a]),
                "gbps_gguf": g, "own_read_gbps": own["gbps"], "host_read_gbps": host["gbps"],
                "ratio_gguf": g / host["gbps"], "huge_page_bytes": huge[a],
                "bytes": sum(m.data.nbytes for x in layers[a] for m in (x.gate, x.up, x.down)),
            }
        )  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| quant | layout | memory | ms med | ms best | GB/s GGUF | own read GB/s | host read GB/s "
        "| ratio (host) | huge pages MiB / MiB |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        out.append(
            f"| {r['quant']} | {r['layout']} | {r['memory']} | {r['seconds'] * 1e3:.3f} | "
            f"{r['seconds_best'] * 1e3:.3f} | {r['gbps_gguf']:.1f} | {r['own_read_gbps']:.1f} | "
            f"{r['host_read_gbps']:.1f} | {r['ratio_gguf']:.2f} | "
            f"{r['huge_page_bytes'] >> 20} / {r['bytes'] >> 20} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--quant", default="IQ3_XXS")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the file arm's files go")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    arms = tuple(a.arms.split(","))
    bad = [x for x in arms if x not in ARMS]
    if bad:
        sys.exit(f"cpu_page_ab: unknown memory kind {bad[0]!r} (known: {', '.join(ARMS)})")
    threads = a.threads or numba.config.NUMBA_NUM_THREADS
    rows = []
    for q in a.quant.split(","):
        rows += run(a.shape, q, threads, a.repeats, arms, a.dir)
    m = machine()
    thp = "?"
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        pass
    print(f"machine: {m['cpu']}, {m['cores']} cores | THP {thp} | commit {_commit()}")
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "machine": m, "thp": thp, "commit": _commit()}, f, indent=2)


if __name__ == "__main__":
    main()
