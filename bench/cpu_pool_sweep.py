"""Sweep the CPU pool over formats and thread counts; write the results table to bench/results/.

    PYTHONPATH=. python bench/cpu_pool_sweep.py       # qwen3-30b-a3b shape, T=1, 1..N threads
    PYTHONPATH=. python bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K --threads 2 --ab --out X
    PYTHONPATH=. python bench/cpu_pool_sweep.py --overhead-only --threads 2   # per-call cost
    PYTHONPATH=. python bench/cpu_pool_sweep.py --quant IQ3_XXS,IQ2_XXS,IQ1_M --layout gguf
        # the gather kernels on the GGUF bytes instead of the repacks ("repack", or per format:
        # --layout auto,IQ1_M=gguf); --ceiling-only: the one-core kernel table alone
    PYTHONPATH=. python bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --layout-ab repack,gguf
        # the layouts timed against each other in one process, calls interleaved; an arm may
        # carry pool prefetch options: --layout-ab gguf,gguf@l2,gguf@pf=16384

Tables: kernel compute ceilings (one core, weights in L2: what the arithmetic allows), the pool
on one decode layer (weights from DRAM, host read bandwidth measured in the same run), the
intermediate-quant A/B, and (--overhead) the pool's fixed cost per call at T=1: the Python
wrapper apart from the jitted call, one parallel region per phase against the fused region.
Everything is imported from `strata` (this file only drives).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from datetime import UTC, datetime

import numba
import numpy as np
from numba import literally, njit, prange

from strata.bench.cpu_pool import (
    _commit,
    _routes,
    arm_spec,
    format_layout_ab,
    format_phases,
    format_table,
    machine,
    make_layer,
    matrix_with_kernel,
    run_cpu_pool_arm,
    run_layout_ab,
    run_quant_ab,
)
from strata.cpu import ExpertPool
from strata.cpu.kernels import dispatch as K
from strata.cpu.layout import prepare
from strata.cpu.quantize import quantize_act
from strata.model.synth import SHAPES
from strata.quant import fmt, random_quantized

ALL = "IQ3_XXS,Q4_K,IQ1_M,IQ3_S,IQ2_XXS,IQ4_XS,Q5_K,Q6_K,Q8_0,IQ2_S"


@njit
def _rows(code, w, act, y, reps):
    literally(code)
    for _ in range(reps):
        for r in range(w.shape[0]):
            y[0, r] += K.dot(code, w, r, act[0], act[1], act[2], act[3], act[4], 0)


def _matrix(quant: str, rows: int, cols: int, layout=None, kernel=None):
    """A random one-expert matrix of `quant` prepared in `layout` (read by `kernel` if given)."""
    rng = np.random.default_rng(0)
    qt = fmt(quant).qtype
    w = random_quantized(qt, (1, rows, cols), rng, 0.05)
    m = prepare(qt, (1, rows, cols), w, layout=layout)
    return qt, (m if kernel is None else matrix_with_kernel(m, kernel)), rng


def kernel_ceiling(quant: str, rows: int = 256, cols: int = 2048, layout=None, kernel=None) -> dict:
    """Weights/s of one core on a matrix that stays in L2 (best of 60 short runs)."""
    qt, m, rng = _matrix(quant, rows, cols, layout, kernel)
    act = quantize_act(rng.standard_normal((1, cols)).astype(np.float32), fmt(qt).vec_dot)
    y = np.zeros((1, rows), np.float32)
    run = K.specialized(_rows, (m.kernel, m.data, act, y, 4), (0,))
    run(m.kernel, m.data, act, y, 4)
    best = min(_timed(run, m.kernel, m.data, act, y, 4) for _ in range(60)) / 4
    return {
        "quant": quant,
        "layout": m.layout,
        "kernel": m.kernel,
        "gweights_s": rows * cols / best / 1e9,
        "gbps_read": m.nbytes / best / 1e9,
        "gbps_gguf": m.gguf_bytes / best / 1e9,
    }


@njit(parallel=True)
def _rows_all(code, ws, act, ys, reps):
    literally(code)
    for t in prange(ws.shape[0]):  # one thread a copy: thread t on its own L2-resident matrix
        for _ in range(reps):
            for r in range(ws.shape[1]):
                ys[t, r] += K.dot(code, ws[t], r, act[0], act[1], act[2], act[3], act[4], 0)


def kernel_ceiling_threads(
    quant: str,
    threads: int,
    rows: int = 256,
    cols: int = 2048,
    layout=None,
    reps: int = 8,
    kernel=None,
) -> dict:
    """`kernel_ceiling` with `threads` cores at once, each on its own copy (still in its L2):
    per-core Gweights/s when every core computes (shared frequency budget, shared core
    resources if the host's cores are hyperthreads), against the same code on one thread."""
    qt, m, rng = _matrix(quant, rows, cols, layout, kernel)
    act = quantize_act(rng.standard_normal((1, cols)).astype(np.float32), fmt(qt).vec_dot)
    out = {"quant": quant, "layout": m.layout, "kernel": m.kernel, "rows": rows, "cols": cols}
    prev = numba.get_num_threads()
    try:
        for nt in sorted({1, threads}):
            numba.set_num_threads(nt)
            ws = np.ascontiguousarray(np.broadcast_to(m.data, (nt,) + m.data.shape))
            ys = np.zeros((nt, rows), np.float32)
            run = K.specialized(_rows_all, (m.kernel, ws, act, ys, reps), (0,))
            run(m.kernel, ws, act, ys, reps)
            best = min(_timed(run, m.kernel, ws, act, ys, reps) for _ in range(30))
            out[f"gweights_s_per_core_t{nt}"] = rows * cols * reps / best / 1e9
    finally:
        numba.set_num_threads(prev)
    out["threads"] = threads
    out["scaling"] = out[f"gweights_s_per_core_t{threads}"] / out["gweights_s_per_core_t1"]
    return out


@njit(parallel=True)
def _empty_region(nt, a):
    for i in prange(nt):
        a[i] += 1


def _median_us(fn, n: int) -> float:
    ts = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e6


def _load_pool_module(path: str):
    """An older strata/cpu/pool.py (`git show REV:strata/cpu/pool.py > FILE`) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("strata_pool_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def overhead(
    shape: str, quant: str, threads: int, ks=(0, 1, 2, 8), rounds: int = 5, baseline=None
) -> list[dict]:
    """Microseconds per T=1 call, fused region (its down expert-major, the default, and by runs of
    rows of every expert) vs one region per phase, split into the Python wrapper and the jitted
    call (the call alone, on prebuilt arguments); arms interleaved, best median of `rounds` (the
    dev box is shared: the best round is the least disturbed).
    `baseline`: an older pool module (its `run_layer` time only)."""
    s = SHAPES[shape]
    lw = make_layer(shape, quant)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, s["n_embd"])).astype(np.float32)
    out = np.zeros_like(x)
    n = 2000 if s["n_embd"] <= 512 else 300
    arms = {
        "fused": ExpertPool(threads, fused=True, team=False),
        "fused, down by runs": ExpertPool(threads, fused=True, down_by_expert=False, team=False),
        "per-phase": ExpertPool(threads, fused=False, team=False),
    }
    if threads > 1:  # the resident team (the default from TEAM_MIN_THREADS): whole calls only
        arms["team"] = ExpertPool(threads, team=True)
    rows = []
    for k in ks:
        routes = [_routes(rng, 1, s["n_expert"], max(k, 1)) for _ in range(64)]
        if k == 0:  # no tasks: the fixed cost alone
            routes = [tuple(r[:0] for r in rt) for rt in routes]
        res = {}  # arm: (pool, its layer, compiled entry and its argument lists or None, ...)
        for name, pool in arms.items():
            for _ in range(2):  # compile, learn the threading layer, warm
                pool.run_layer(x, *routes[0], lw, out=out)
            if pool.team:  # whole calls only
                res[name] = (pool, lw, None, None, [], [])
                continue
            _lw, wargs, entries, _desc = pool._plans[id(lw)]
            fn = next(iter(entries.values()))
            knobs = pool._knobs(pool.fused and pool._fused_ok is not False)
            argv = [(x, *rt, out, *wargs, *pool._ws_args, *knobs) for rt in routes]
            res[name] = (pool, lw, fn, argv, [], [])
        if baseline is not None:  # whole calls only
            old = baseline.ExpertPool(threads)
            old_lw = baseline.LayerWeights(lw.gate, lw.up, lw.down)
            for _ in range(2):
                old.run_layer(x, *routes[0], old_lw, out=out)
            res["baseline"] = (old, old_lw, None, None, [], [])
        for _ in range(rounds):
            for pool, layer, fn, argv, call, jit in res.values():

                def one_call(i, pool=pool, routes=routes, layer=layer):
                    pool.run_layer(x, *routes[i % 64], layer, out=out)

                call.append(_median_us(one_call, n))
                if fn is None:
                    jit.append(float("nan"))
                else:
                    jit.append(_median_us(lambda i, fn=fn, argv=argv: fn(*argv[i % 64]), n))
        for name, (pool, _layer, _fn, _argv, call, jit) in res.items():
            c, j = min(call), min(jit)
            fused_active = bool(getattr(pool, "fused", False) and pool._fused_ok)
            rows.append(
                dict(shape=shape, quant=quant, threads=threads, experts=k, arm=name,
                     fused_active=fused_active, call_us=c, jit_us=j, wrapper_us=c - j)
            )  # fmt: skip
    return rows


def empty_region_us(threads: int) -> float:
    numba.set_num_threads(threads)
    a = np.zeros(threads, np.float64)
    _empty_region(threads, a)
    return min(_median_us(lambda i: _empty_region(threads, a), 3000) for _ in range(3))


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--quant", default=ALL)
    ap.add_argument("--threads", default="")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--ab", action="store_true", help="also the intermediate-quant A/B")
    ap.add_argument("--out", default="", help="path stem for .md and .json")
    ap.add_argument(
        "--layout",
        default=None,
        help="auto, gguf (the file's bytes) or repack, or per format: auto,IQ1_M=gguf",
    )
    ap.add_argument(
        "--layout-ab",
        default="",
        help="layouts timed against each other, calls interleaved (e.g. repack,gguf)",
    )
    ap.add_argument("--ceiling-only", action="store_true", help="only the one-core kernel table")
    ap.add_argument(
        "--ceiling-threads",
        type=int,
        default=0,
        help="also each kernel on this many cores at once, each on its own L2-resident copy",
    )
    ap.add_argument("--wait-quiet", action="store_true", help="wait for an idle machine first")
    ap.add_argument("--overhead", action="store_true", help="also the per-call fixed cost table")
    ap.add_argument(
        "--overhead-only", action="store_true", help="only the per-call fixed cost table"
    )
    ap.add_argument(
        "--baseline-pool",
        default="",
        help="an older pool.py (git show REV:strata/cpu/pool.py > FILE) timed beside (overhead)",
    )
    a = ap.parse_args()
    quants = a.quant.split(",")
    threads = (
        [int(t) for t in a.threads.split(",")]
        if a.threads
        else sorted({1, numba.config.NUMBA_NUM_THREADS})
    )
    ovh = []
    if a.overhead or a.overhead_only:
        base = _load_pool_module(a.baseline_pool) if a.baseline_pool else None
        for t in threads:
            ovh += overhead("tiny", quants[0], t, baseline=base)
            ovh += overhead(a.shape, quants[0], t, baseline=base)
            ovh.append({"empty_region_us": empty_region_us(t), "threads": t})
    lays = a.layout_ab.split(",") if a.layout_ab else [a.layout]
    # (layout, kernel override) per arm (None: the pool's default); pool options don't matter
    kl = dict.fromkeys(
        (arm_spec(x)[0], arm_spec(x)[1].get("kernel")) if x else (None, None) for x in lays
    )
    ceil = (
        []
        if a.overhead_only
        else [kernel_ceiling(q, layout=x, kernel=k) for q in quants for x, k in kl]
    )
    ceil_all = (
        [
            kernel_ceiling_threads(q, a.ceiling_threads, layout=x, kernel=k)
            for q in quants
            for x, k in kl
        ]
        if a.ceiling_threads and not a.overhead_only
        else []
    )
    pool = []
    for q in [] if a.overhead_only or a.ceiling_only or a.layout_ab else quants:
        for t in threads:
            pool.append(
                run_cpu_pool_arm(
                    a.shape,
                    q,
                    a.tokens,
                    t,
                    a.repeats,
                    print_table=False,
                    wait_quiet=a.wait_quiet,
                    layout=a.layout,
                )
            )
            gc.collect()
    lab = []
    for q in quants if a.layout_ab and not a.ceiling_only else []:
        for t in threads:
            lab += run_layout_ab(
                a.shape,
                q,
                tuple(lays),
                a.tokens,
                t,
                a.repeats,
                print_table=False,
                wait_quiet=a.wait_quiet,
            )
            gc.collect()
    ab = (
        run_quant_ab(
            a.shape, "IQ3_XXS", threads=max(threads), print_table=False, wait_quiet=a.wait_quiet
        )
        if a.ab
        else []
    )
    md = _markdown(a, ceil, pool, ab, ovh, lab, ceil_all)
    print(md)
    if a.out:
        with open(a.out + ".md", "w") as f:
            f.write(md)
        with open(a.out + ".json", "w") as f:
            json.dump(
                {
                    "kernels": ceil,
                    "kernels_all_cores": ceil_all,
                    "pool": pool,
                    "quant_ab": ab,
                    "layout_ab": lab,
                    "overhead": ovh,
                    "machine": machine(),
                    "commit": _commit(),
                },
                f,
                indent=2,
            )


def _markdown(a, ceil, pool, ab, ovh=(), lab=(), ceil_all=()) -> str:
    m = machine()
    out = [
        f"# CPU pool: {a.shape}, T={a.tokens}",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, SIMD path {m['simd']}, numba {m['numba']} "
        f"({m['threading_layer']})",
        f"- commit: {_commit()}",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        "- command: `PYTHONPATH=. python bench/cpu_pool_sweep.py "
        f"--quant {a.quant} --threads {a.threads or 'default'} --tokens {a.tokens}"
        f"{' --layout ' + a.layout if a.layout else ''}"
        f"{' --layout-ab ' + a.layout_ab if a.layout_ab else ''}"
        f"{' --ceiling-only' if a.ceiling_only else ''}"
        f"{f' --ceiling-threads {a.ceiling_threads}' if a.ceiling_threads else ''}"
        f"{' --ab' if a.ab else ''}{' --overhead' if a.overhead else ''}"
        f"{' --overhead-only' if a.overhead_only else ''}"
        f"{' --baseline-pool ' + a.baseline_pool if a.baseline_pool else ''}`",
        "",
    ]
    if ovh:
        out += [
            "## Fixed cost per call, T=1 (microseconds, best median of 5 interleaved rounds)",
            "",
            "`call` = `run_layer`; `jit` = the compiled entry on prebuilt arguments; `wrapper` =",
            "their difference (Python in `run_layer`). experts = 0: no tasks (pure fixed cost).",
            "`baseline`: the `--baseline-pool` file's `run_layer` (whole calls only).",
            "",
            "| shape | threads | experts | arm | call us | jit us | wrapper us |",
            "| --- | ---: | ---: | --- | ---: | ---: | ---: |",
        ]
        for r in ovh:
            if "empty_region_us" in r:
                continue
            arm = r["arm"] + ("" if r["fused_active"] or r["arm"] != "fused" else " (off)")
            jit = "-" if r["jit_us"] != r["jit_us"] else f"{r['jit_us']:.1f}"  # NaN: baseline
            wrap = "-" if jit == "-" else f"{r['wrapper_us']:.1f}"
            out.append(
                f"| {r['shape']} | {r['threads']} | {r['experts']} | {arm} | {r['call_us']:.1f} |"
                f" {jit} | {wrap} |"
            )
        for r in ovh:
            if "empty_region_us" in r:
                out.append(
                    f"\nAn empty Numba parallel region over {r['threads']} threads: "
                    f"{r['empty_region_us']:.1f} us."
                )
        out.append("")
    if ceil:
        out += [
            "## Kernel compute ceiling (1 core, weights in L2)",
            "",
            "| quant | layout | kernel | Gweights/s | GB/s read | GB/s GGUF |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
    for c in ceil:
        out.append(
            f"| {c['quant']} | {c['layout']} | {c['kernel']} | {c['gweights_s']:.1f} | "
            f"{c['gbps_read']:.1f} | {c['gbps_gguf']:.1f} |"
        )
    if ceil_all:
        nt = ceil_all[0]["threads"]
        out += [
            "",
            f"## Kernel compute ceiling on {nt} cores at once (each its own copy in its L2)",
            "",
            f"| quant | layout | kernel | Gweights/s a core, 1 thread | a core, {nt} threads "
            "| ratio |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for c in ceil_all:
            out.append(
                f"| {c['quant']} | {c['layout']} | {c['kernel']} | "
                f"{c['gweights_s_per_core_t1']:.1f} | {c[f'gweights_s_per_core_t{nt}']:.1f} | "
                f"{c['scaling']:.2f} |"
            )
    if lab:
        out += [
            "",
            "## Layouts against each other, calls interleaved (one layer from DRAM)",
            "",
            "```",
            format_layout_ab(list(lab)),
            "```",
        ]
        if format_phases(list(lab)):
            out += [
                "",
                "Where each call's time went (`ExpertPool.last_phases`, us, median over calls of"
                " the slowest / mean / fastest thread; start: caller to thread entry, barrierN:"
                " the wait at barrier N, join: thread end to caller):",
                "",
                format_phases(list(lab)),
            ]
    if pool:
        out += [
            "",
            "## Pool, one layer from DRAM (median of repeats)",
            "",
            "```",
            format_table(pool),
            "```",
        ]
    if ab:
        out += [
            "",
            "## Intermediate-quant A/B (IQ3_XXS, seconds per layer)",
            "",
            "| T | tasks | parallel med | sequential med | parallel best | sequential best |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in ab:
            out.append(
                f"| {r['tokens']} | {r['tasks']} | {r['parallel']:.5f} | "
                f"{r['sequential']:.5f} | {r['parallel_best']:.5f} | "
                f"{r['sequential_best']:.5f} |"
            )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
