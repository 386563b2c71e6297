"""Start time of the CPU pool's miss runner with and without the expert pack.

    PYTHONPATH=. python bench/pack_start.py MODEL.gguf PACK_DIR [--repeats 5] [--json OUT]

Each arm runs in a fresh process (Numba's compiled kernels come from its on-disk cache; one
unmeasured warm-up per arm fills it):

    gguf          PoolMissRunner(model)                  today's start: `prepare` every layer
    pack          PoolMissRunner(model, pack=DIR)        mmap + provenance and layout checks
    pack-ram      ... resident_experts=True              a RAM copy from the pack
    gguf-ram      PoolMissRunner(model, resident_experts=True)  a RAM copy prepared from the GGUF

Per run: `init` (the constructor), `first_pass` (one layer call per layer with every expert
active, so every expert byte is read once: page faults of the mmap land here) and the process's
RssAnon / RssFile afterwards. Reports the median of the repeats. The page cache is warm (the
files were just written or read); dropping it needs root and disturbs the machine, so cold
starts are not measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

ARMS = ("gguf", "pack", "pack-ram", "gguf-ram")


def _rss() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon", "RssFile", "RssShmem")):
                k, v, _ = line.split()
                out[k.rstrip(":")] = int(v) * 1024
    return out


def child(model_path: str, pack: str, arm: str, threads: int) -> dict:
    import numpy as np

    from strata.cpu.runner import PoolMissRunner
    from strata.model.loader import load_model

    model = load_model(model_path)
    a = model.args
    kw = dict(
        pack=pack if arm.startswith("pack") else None,
        resident_experts=arm.endswith("-ram"),
        progress=False,
    )
    t0 = time.perf_counter()
    runner = PoolMissRunner(model, threads, **kw)
    t1 = time.perf_counter()
    k = a.n_expert_used
    t = -(-a.n_expert // k)
    ids = (np.arange(t * k) % a.n_expert).reshape(t, k)  # [T, K]: every expert once
    w = np.full(ids.shape, 1.0 / k, np.float32)
    h = np.random.default_rng(0).standard_normal((t, a.n_embd)).astype(np.float32)
    for i in range(a.n_layer):
        runner.experts(i, h, ids, w)
    t2 = time.perf_counter()
    return dict(arm=arm, init_s=t1 - t0, first_pass_s=t2 - t1, ram_bytes=runner.ram_bytes, **_rss())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("pack")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        print(json.dumps(child(ns.model, ns.pack, ns.child, ns.threads)))
        return 0
    rows = []
    for arm in ns.arms.split(","):
        runs = []
        for r in range(ns.repeats + 1):  # run 0 warms Numba's cache
            cmd = [sys.executable, __file__, ns.model, ns.pack, "--child", arm]
            out = subprocess.run(cmd + ["--threads", str(ns.threads)], capture_output=True)
            if out.returncode:
                sys.stderr.write(out.stderr.decode())
                return 1
            if r:
                runs.append(json.loads(out.stdout.decode().strip().splitlines()[-1]))
        med = {
            k: statistics.median(x[k] for x in runs)
            for k in ("init_s", "first_pass_s", "RssAnon", "RssFile", "ram_bytes")
        }
        rows.append(dict(arm=arm, runs=runs, **med))
        print(
            f"{arm:9s} init {med['init_s']:7.3f} s  first pass {med['first_pass_s']:7.3f} s  "
            f"RssAnon {med['RssAnon'] / 2**20:8.1f} MiB  RssFile {med['RssFile'] / 2**20:8.1f} MiB"
            f"  RAM copy {med['ram_bytes'] / 2**20:8.1f} MiB",
            flush=True,
        )
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
