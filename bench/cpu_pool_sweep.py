"""Sweep the CPU pool over formats and thread counts; write the results table to bench/results/.

    PYTHONPATH=. python bench/cpu_pool_sweep.py       # qwen3-30b-a3b shape, T=1, 1..N threads
    PYTHONPATH=. python bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K --threads 2 --ab --out X

Three tables: kernel compute ceilings (one core, weights in L2: what the arithmetic allows),
the pool on one decode layer (weights from DRAM, host read bandwidth measured in the same run)
and the intermediate-quant A/B. Everything is imported from `strata` (this file only drives).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from datetime import UTC, datetime

import numba
import numpy as np
from numba import literally, njit

from strata.bench.cpu_pool import _commit, format_table, machine, run_cpu_pool_arm, run_quant_ab
from strata.cpu.kernels import dispatch as K
from strata.cpu.layout import prepare
from strata.cpu.quantize import quantize_act
from strata.quant import fmt, random_quantized

ALL = "IQ3_XXS,Q4_K,IQ1_M,IQ3_S,IQ2_XXS,IQ4_XS,Q5_K,Q6_K,Q8_0,IQ2_S"


@njit
def _rows(code, w, act, y, reps):
    literally(code)
    for _ in range(reps):
        for r in range(w.shape[0]):
            y[0, r] += K.dot(code, w, r, act[0], act[1], act[2], act[3], act[4], 0)


def kernel_ceiling(quant: str, rows: int = 256, cols: int = 2048, layout=None) -> dict:
    """Weights/s of one core on a matrix that stays in L2 (best of 60 short runs)."""
    rng = np.random.default_rng(0)
    qt = fmt(quant).qtype
    w = random_quantized(qt, (1, rows, cols), rng, 0.05)
    m = prepare(qt, (1, rows, cols), w, layout=layout)
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
    ap.add_argument("--layout", default=None, help="auto (repack where it pays) or gguf")
    ap.add_argument("--wait-quiet", action="store_true", help="wait for an idle machine first")
    a = ap.parse_args()
    quants = a.quant.split(",")
    threads = (
        [int(t) for t in a.threads.split(",")]
        if a.threads
        else sorted({1, numba.config.NUMBA_NUM_THREADS})
    )
    ceil = [kernel_ceiling(q, layout=a.layout) for q in quants]
    pool = []
    for q in quants:
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
    ab = (
        run_quant_ab(
            a.shape, "IQ3_XXS", threads=max(threads), print_table=False, wait_quiet=a.wait_quiet
        )
        if a.ab
        else []
    )
    md = _markdown(a, ceil, pool, ab)
    print(md)
    if a.out:
        with open(a.out + ".md", "w") as f:
            f.write(md)
        with open(a.out + ".json", "w") as f:
            json.dump(
                {
                    "kernels": ceil,
                    "pool": pool,
                    "quant_ab": ab,
                    "machine": machine(),
                    "commit": _commit(),
                },
                f,
                indent=2,
            )


def _markdown(a, ceil, pool, ab) -> str:
    m = machine()
    out = [
        f"# CPU pool: {a.shape}, T={a.tokens}",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, SIMD path {m['simd']}, numba {m['numba']} "
        f"({m['threading_layer']})",
        f"- commit: {_commit()} (plus the working tree)",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        "- command: `PYTHONPATH=. python bench/cpu_pool_sweep.py "
        f"--quant {a.quant} --threads {a.threads or 'default'} --tokens {a.tokens}"
        f"{' --layout ' + a.layout if a.layout else ''}"
        f"{' --ab' if a.ab else ''}`",
        "",
        "## Kernel compute ceiling (1 core, weights in L2)",
        "",
        "| quant | layout | Gweights/s | GB/s read | GB/s GGUF |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for c in ceil:
        out.append(
            f"| {c['quant']} | {c['layout']} | {c['gweights_s']:.1f} | "
            f"{c['gbps_read']:.1f} | {c['gbps_gguf']:.1f} |"
        )
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
