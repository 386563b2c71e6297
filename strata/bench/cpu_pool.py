"""The `cpu-pool` arm: one layer of random experts through the CPU pool, against host bandwidth.

No model file is needed: expert tensors of a named shape (`strata.model.synth.SHAPES`) are drawn
with `strata.quant.random_quantized`, every repeat routes each token to K random experts of the
next of several copies of the layer (together over twice the last-level cache, so the weights
come from DRAM, as in decode), and the pool is timed warm (median of repeats). The host
read bandwidth is measured in the same run with the same threads; the ratio is the figure of
merit. Bytes are counted in the GGUF's own encoding (and in the repacked layout where the
kernels read a fatter one).
"""

from __future__ import annotations

import json
import os
import platform
import time
from datetime import UTC, datetime

import numba
import numpy as np

from strata.cpu.bandwidth import host_read_bandwidth, read_bandwidth
from strata.cpu.kernels.simd import simd_level
from strata.cpu.pool import ExpertPool, prepare_layer
from strata.model.synth import SHAPES
from strata.quant import fmt, random_quantized


class _Tensor:
    __slots__ = ("qtype", "shape", "data")

    def __init__(self, qtype, shape, data):
        self.qtype, self.shape, self.data = qtype, shape, data


def machine() -> dict:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "simd": simd_level(),
        "numba": numba.__version__,
        "threading_layer": _threading_layer(),
    }


def _threading_layer() -> str:
    try:
        return numba.threading_layer()
    except ValueError:  # no parallel region has run yet
        return "?"


def _commit() -> str:
    """The tree's commit (strata.bench.common: honours STRATA_COMMIT where there is no .git)."""
    from strata.bench.common import commit

    return commit()


def make_layer(shape: str, quant: str, seed: int = 0, layout: str | None = None):
    """Random gate/up/down expert tensors of one layer of `shape`, prepared for the pool."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
    s = SHAPES[shape]
    e, f, d = s["n_expert"], s["expert_ff"], s["n_embd"]
    qt = fmt(quant).qtype
    rng = np.random.default_rng(seed)
    mats = [
        _Tensor(qt, sh, random_quantized(qt, sh, rng, 1.0 / np.sqrt(sh[-1])))
        for sh in ((e, f, d), (e, f, d), (e, d, f))
    ]
    return prepare_layer(*mats, layout=layout)


def layer_copies(lw, min_bytes: int | None = None, copy=None) -> list:
    """`lw` and copies of its expert bytes in fresh memory, enough that together they are at
    least twice the last-level cache (min_bytes): timed in rotation, each call reads weights
    the cache no longer holds, as a decode step going through all layers does. A single layer
    timed again and again stays partly cached on a host whose LLC is as large as a layer
    (Sapphire Rapids here: 300 MiB of L3 against 316 MB of Qwen3-30B-A3B IQ3_XXS experts).
    copy: a function array -> its copy in some kind of memory (bench/cpu_page_ab.py); then
    every layer of the list is such a copy, `lw` itself is not among them."""
    from dataclasses import replace

    from strata.cpu.bandwidth import llc_bytes

    want = 2 * llc_bytes() if min_bytes is None else min_bytes
    one = sum(m.data.nbytes for m in (lw.gate, lw.up, lw.down))
    n = max(1, -(-want // max(one, 1)))
    out = [lw] if copy is None else []
    copy = copy or np.ndarray.copy
    while len(out) < n:
        out.append(
            replace(lw, **{k: replace(getattr(lw, k), data=copy(getattr(lw, k).data))
                           for k in ("gate", "up", "down")})
        )  # fmt: skip
    return out


def _routes(rng, t_n: int, n_expert: int, k: int):
    ids = np.argsort(rng.random((t_n, n_expert)), axis=1)[:, :k]  # K distinct experts per token
    tok = np.repeat(np.arange(t_n, dtype=np.int32), k)
    w = rng.random((t_n, k)).astype(np.float32)
    w /= w.sum(axis=1, keepdims=True)
    return tok, ids.ravel().astype(np.int32), w.ravel()


def _route_seq(rng, count: int, t_n: int, n_expert: int, k: int) -> list:
    """`count` routings for calls in a row. At T = 1 the calls walk through a random
    permutation of the experts k at a time (a fresh permutation each pass), so an expert comes
    back only after n_expert / k calls: with the layer copies in rotation the bytes read between
    two reads of one (copy, expert) are then several times the LLC, as in a decode step through
    all layers (random picks bring ~30% of a T = 1 call's experts back from the 300 MiB LLC of
    the H200's host within 20 calls)."""
    if t_n != 1 or n_expert < 2 * k:
        return [_routes(rng, t_n, n_expert, k) for _ in range(count)]
    out, perm = [], np.zeros(0, np.int64)
    for _ in range(count):
        if perm.size < k:
            perm = rng.permutation(n_expert)
        ids, perm = perm[:k], perm[k:]
        w = rng.random(k).astype(np.float32)
        out.append((np.zeros(k, np.int32), ids.astype(np.int32), w / w.sum()))
    return out


def wait_for_idle(max_s: float = 300.0, idle: float = 0.92, span: float = 1.0) -> bool:
    """Wait until the machine is idle (other processes' load) for two spans in a row.

    Shared dev boxes run other people's tests; a 2-thread pool measured next to them reads
    scheduler quanta, not memory bandwidth. Returns False if it never got quiet.
    """

    def ticks():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)

    t_end, streak = time.monotonic() + max_s, 0
    while time.monotonic() < t_end:
        i0, a0 = ticks()
        time.sleep(span)
        i1, a1 = ticks()
        streak = streak + 1 if (i1 - i0) >= idle * max(a1 - a0, 1) else 0
        if streak >= 2:
            return True
    return False


def time_pool(pool: ExpertPool, lw, d: int, tokens: int, k: int, repeats: int, seed: int = 1):
    """Median seconds of `pool.run_layer` over `repeats` fresh routings; bytes of the last.
    `lw`: one layer, or a list of layers (`layer_copies`) the calls take in rotation."""
    lws = lw if isinstance(lw, list) else [lw]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    routes = _route_seq(rng, repeats + 1, tokens, lws[0].gate.n_expert, k)
    pool.run_layer(x, *routes[0], lws[-1])  # compile / warm
    times, nbytes, gbytes, active = [], [], [], []
    for j, r in enumerate(routes[1:]):
        t0 = time.perf_counter()
        pool.run_layer(x, *r, lws[j % len(lws)])
        times.append(time.perf_counter() - t0)
        nbytes.append(pool.last_bytes)
        gbytes.append(pool.last_gguf_bytes)
        active.append(pool.last_active_experts)
    i = int(np.argsort(times)[len(times) // 2])
    return times[i], nbytes[i], gbytes[i], active[i]


def time_served(pool: ExpertPool, lws: list, d: int, k: int, repeats: int, seed: int = 2):
    """Median seconds a layer, and GGUF bytes a layer, when decode steps over the layers `lws`
    run through `strata.cpu.serve.StepServer` (the engine's queued step: one compiled call
    serves every layer, no Python between layers): each step's records hold fresh T = 1
    routings (`_route_seq`), every pick the pool's, all published before the step. None where
    the pool cannot serve steps (no resident team)."""
    from strata.cpu.serve import DONE, StepServer, record_views

    n = len(lws)
    recs = np.zeros((n, 4 * k + 4 + d), np.uint32)
    rec = record_views(recs, k)
    ready, release = np.zeros(n, np.int32), np.zeros(1, np.uint32)
    y = np.zeros((1, d), np.float32)
    srv = StepServer.build(pool, lws, recs, ready, release, y, None)
    if srv is None:
        return None
    rng = np.random.default_rng(seed)
    routes = _route_seq(rng, (repeats + 1) * n, 1, lws[0].gate.n_expert, k)
    times, gbytes = [], []
    for step in range(1, repeats + 2):
        for i in range(n):
            _, ids, w = routes[(step - 1) * n + i]
            rec["ids0"][i] = rec["ids"][i] = ids
            rec["pair_slot"][i], rec["weights"][i] = -1, w  # every pick the pool's
            rec["stats"][i] = (k, 0, k, 0)
            rec["h"][i] = rng.standard_normal(d)
        ready[:] = step
        t0 = time.perf_counter()
        status, _ = srv.run(step)
        dt = time.perf_counter() - t0
        if status != DONE:
            raise RuntimeError(f"the step server stopped with status {status}")
        c = srv.take_counts()
        if step > 1:  # the first compiles
            times.append(dt / n)
            gbytes.append(c["gguf_bytes"] / n)
    return float(np.median(times)), float(np.median(gbytes))


def _rates(gbytes: float, nbytes: float, sec: float, host: dict) -> dict:
    """Bytes per call (GGUF encoding and the kernels' layout), the GB/s they make in `sec`, and
    both against the host read bandwidth `host` (`host_read_bandwidth`)."""
    return {
        "weight_bytes_gguf": gbytes,
        "weight_bytes_read": nbytes,
        "gbps_gguf": gbytes / sec / 1e9,
        "gbps_read": nbytes / sec / 1e9,
        "host_read_gbps": host["gbps"],
        "host_read_best_gbps": host["best_gbps"],
        "host_read_plain_gbps": host.get("plain_gbps"),  # the two reads' medians
        "host_read_prefetch_gbps": host.get("prefetch_gbps"),
        "ratio_gguf": gbytes / sec / 1e9 / host["gbps"],
        "ratio_read": nbytes / sec / 1e9 / host["gbps"],
    }


def _stamp() -> dict:
    return {
        "machine": machine(),
        "commit": _commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def run_cpu_pool_arm(
    shape: str = "qwen3-30b-a3b",
    quant: str = "IQ3_XXS",
    tokens: int = 1,
    threads: int | None = None,
    repeats: int = 20,
    json_path: str | None = None,
    layout: str | None = None,
    parallel_quant: bool | None = None,
    print_table: bool = True,
    wait_quiet: bool = False,
) -> dict:
    """Time one layer of `shape` experts in `quant` through the pool; report GB/s vs the host.

    Returns (and with `json_path` writes) a dict: tokens, experts per token, tasks, active
    experts, weight bytes read (GGUF encoding and the kernels' layout), seconds, achieved GB/s
    both ways, the host read bandwidth of the same run and the ratios, and for T = 1 the decode
    rate all layers would give if every expert ran on the CPU.
    """
    threads = threads or numba.config.NUMBA_NUM_THREADS
    s = SHAPES[shape]
    k, d, n_layer = s["n_expert_used"], s["n_embd"], s["n_layer"]
    lw = make_layer(shape, quant, layout=layout)
    lws = layer_copies(lw)  # rotate through > 2x the LLC: weights come from DRAM
    pool = ExpertPool(threads, parallel_quant=parallel_quant)
    quiet = wait_for_idle() if wait_quiet else None
    sec, nbytes, gbytes, active = time_pool(pool, lws, d, tokens, k, repeats)
    served = time_served(pool, lws, d, k, repeats) if tokens == 1 else None
    time.sleep(0.05)  # the pool's threads asleep before the read (a team's members spin 4 ms)
    host = host_read_bandwidth(threads)
    own = read_bandwidth([m.data for x in lws for m in (x.gate, x.up, x.down)], threads)
    res = {
        "arm": "cpu-pool",
        "shape": shape,
        "quant": fmt(quant).name,
        "layout": f"{lw.gate.layout}/{lw.up.layout}/{lw.down.layout}",
        "threads": threads,
        "tokens": tokens,
        "experts_per_token": k,
        "tasks": tokens * k,
        "active_experts": active,
        "repeats": repeats,
        "layer_copies": len(lws),
        "parallel_quant": pool.parallel_quant,
        "units": pool.units,
        "down_units": pool.down_units,
        "tail_split": pool.tail_split,
        "wait_prefetch": pool.wait_prefetch,
        "quant_min_tasks": pool.quant_min_tasks,
        "seconds": sec,
        **_rates(gbytes, nbytes, sec, host),
        # the same two reads over the pool's own weight pages (read_bandwidth: where a VM's
        # buffers differ in speed, this one sits where the pool's bytes sit)
        "weights_read_gbps": own["gbps"],
        "ratio_gguf_weights": gbytes / sec / 1e9 / own["gbps"],
        "ratio_read_weights": nbytes / sec / 1e9 / own["gbps"],
        "decode_tok_s_all_cpu": 1.0 / (sec * n_layer) if tokens == 1 else None,
        # T = 1 through the engine's step server (`time_served`: every layer of a step in one
        # compiled call, as the engine's queued decode step runs the pool); None without a team
        "served_seconds": served[0] if served else None,
        "served_gbps_gguf": served[1] / served[0] / 1e9 if served else None,
        "served_ratio_gguf": served[1] / served[0] / 1e9 / host["gbps"] if served else None,
        "served_ratio_gguf_weights": served[1] / served[0] / 1e9 / own["gbps"] if served else None,
        "served_decode_tok_s_all_cpu": 1.0 / (served[0] * n_layer) if served else None,
        "waited_for_quiet": quiet,
        **_stamp(),
    }
    if print_table:
        print(format_table([res]))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=2)
    return res


def run_quant_ab(
    shape: str = "qwen3-30b-a3b",
    quant: str = "IQ3_XXS",
    tokens: tuple[int, ...] = (1, 8, 64, 512),
    threads: int | None = None,
    repeats: int = 10,
    print_table: bool = True,
    wait_quiet: bool = False,
) -> list[dict]:
    """The intermediate-quant A/B: parallel phase against the sequential loop.

    The two arms alternate call by call on the same routings (so drift and noise from other
    processes fall on both); reported per arm: median and best seconds.
    """
    threads = threads or numba.config.NUMBA_NUM_THREADS
    s = SHAPES[shape]
    k = s["n_expert_used"]
    lw = make_layer(shape, quant)
    arms = {
        "parallel": ExpertPool(threads, parallel_quant=True, quant_min_tasks=1),
        "sequential": ExpertPool(threads, parallel_quant=False),
    }
    default = ExpertPool(threads)
    rows = []
    rng = np.random.default_rng(3)
    for t in tokens:
        x = rng.standard_normal((t, s["n_embd"])).astype(np.float32)
        routes = [_routes(rng, t, lw.gate.n_expert, k) for _ in range(repeats)]
        times = {a: [] for a in arms}
        for pool in arms.values():
            pool.run_layer(x, *routes[0], lw)  # compile / warm
        if wait_quiet:
            wait_for_idle()
        for i, r in enumerate(routes):
            order = list(arms) if i % 2 == 0 else list(arms)[::-1]
            for a in order:
                t0 = time.perf_counter()
                arms[a].run_layer(x, *r, lw)
                times[a].append(time.perf_counter() - t0)
        row = {"tokens": t, "tasks": t * k}
        for a, ts in times.items():
            row[a] = float(np.median(ts))
            row[a + "_best"] = min(ts)
        min_tasks = default._knobs(default.fused)[2]  # (1 in the fused region or on the team)
        row["default"] = (
            "parallel" if default.parallel_quant and t * k >= min_tasks else "sequential"
        )
        rows.append(row)
    if print_table:
        print(f"intermediate-quant A/B, {shape} {quant}, {threads} threads (seconds per layer)")
        print(
            f"{'T':>5} {'tasks':>6} {'par med':>9} {'seq med':>9} {'par best':>9} "
            f"{'seq best':>9} {'best p/s':>8} default"
        )
        for r in rows:
            print(
                f"{r['tokens']:>5} {r['tasks']:>6} {r['parallel']:>9.5f} {r['sequential']:>9.5f} "
                f"{r['parallel_best']:>9.5f} {r['sequential_best']:>9.5f} "
                f"{r['parallel_best'] / r['sequential_best']:>8.3f} {r['default']}"
            )
    return rows


def arm_spec(spec: str) -> tuple[str, dict]:
    """A layout A/B arm: "gguf", "gguf@l2", "repack@pf=16384", "repack@u=0", "gguf@k=42": the
    layout, then the pool's knobs (l2 / l1: rows ahead into L2 or L1; pf=N: at least N bytes
    ahead; u=N / d=N: N gate/up / down work units a thread in the dynamic schedule, 0 the
    static split; wp=0 / wp=1: barriers that only wait / prefetch the next phase's first rows;
    dx=0 / dx=1: down in runs of rows of every expert / expert-major, then summed; eq=0 / eq=1:
    the intermediate quantized after a barrier / by the thread completing each block; pl=0 /
    pl=1: barriers between gate/up, the intermediate's quantization and down / the three
    pipelined, no barrier; ts=N: the last units, one a thread's worth, N times smaller) or
    k=CODE, a kernel code of strata.cpu.kernels.dispatch that reads that layout (returned as
    "kernel"; the pool itself never takes it)."""
    lay, *opts = spec.split("@")
    kw: dict = {}
    for o in opts:
        if o in ("l1", "l2"):
            kw["prefetch_l2"] = o == "l2"
        elif o.startswith("pf=") and o[3:].isdigit():
            kw["prefetch_bytes"] = int(o[3:])
        elif o.startswith("u=") and o[2:].isdigit():
            kw["units"] = int(o[2:])
        elif o.startswith("d=") and o[2:].isdigit():
            kw["down_units"] = int(o[2:])
        elif o in ("wp=0", "wp=1"):
            kw["wait_prefetch"] = o == "wp=1"
        elif o in ("dx=0", "dx=1"):
            kw["down_by_expert"] = o == "dx=1"
        elif o in ("eq=0", "eq=1"):
            kw["eager_quant"] = o == "eq=1"
        elif o in ("pl=0", "pl=1"):
            kw["pipeline"] = o == "pl=1"
        elif o.startswith("ts=") and o[3:].isdigit() and int(o[3:]) >= 1:
            kw["tail_split"] = int(o[3:])
        elif o.startswith("k=") and o[2:].isdigit():
            kw["kernel"] = int(o[2:])
        else:
            raise ValueError(
                f"unknown pool option {o!r} in arm {spec!r} (l1, l2, pf=BYTES, u=UNITS,"
                " d=UNITS, wp=0|1, dx=0|1, eq=0|1, pl=0|1, ts=N, k=KERNEL)"
            )
    return lay, kw


def matrix_with_kernel(m, code: int):
    """ExpertMatrix `m` read by kernel `code` instead (same bytes; an arm's k=CODE)."""
    from dataclasses import replace

    from strata.cpu.kernels.dispatch import KERNELS

    if code not in KERNELS:
        raise ValueError(f"no kernel code {code} in strata.cpu.kernels.dispatch")
    return replace(m, kernel=code)


def _with_kernel(lw, code: int):
    """LayerWeights `lw` with every matrix read by kernel `code`."""
    from dataclasses import replace

    return replace(
        lw, **{m: matrix_with_kernel(getattr(lw, m), code) for m in ("gate", "up", "down")}
    )


def run_layout_ab(
    shape: str = "qwen3-30b-a3b",
    quant: str = "IQ3_XXS",
    layouts: tuple[str, ...] = ("repack", "gguf"),
    tokens: int = 1,
    threads: int | None = None,
    repeats: int = 30,
    print_table: bool = True,
    wait_quiet: bool = False,
) -> list[dict]:
    """Layouts of one format (e.g. a SIMD repack against the GGUF bytes; each may carry pool
    prefetch options, `arm_spec`) timed against each other in one process: each layout's layer
    copies (> 2x the LLC apiece) built from the same random experts, the arms alternating call
    by call on the same routings (ABBA order), so that a host's drift falls on every arm alike
    (on the H200's host the pool's figures moved 10-40% between calls, more than the kernels
    differ). Per arm: median, best and mean seconds per layer, GB/s of GGUF bytes and of the
    bytes read (a call's mean bytes over the median time: one descheduled call in 40 that took
    15 ms halved a mean-time figure), and their ratio to the host read bandwidth measured once
    in the same run."""
    threads = threads or numba.config.NUMBA_NUM_THREADS
    s = SHAPES[shape]
    k, d = s["n_expert_used"], s["n_embd"]
    specs = {a: arm_spec(a) for a in layouts}
    copies = {}  # arms of one layout share its layer copies
    for lay, _ in specs.values():
        if lay not in copies:
            copies[lay] = layer_copies(make_layer(shape, quant, layout=lay))
    arms = {}
    for a, (lay, kw) in specs.items():
        code = kw.pop("kernel", None)
        arms[a] = copies[lay] if code is None else [_with_kernel(lw, code) for lw in copies[lay]]
    pools = {a: ExpertPool(threads, **kw) for a, (_, kw) in specs.items()}
    rng = np.random.default_rng(1)
    x = rng.standard_normal((tokens, d)).astype(np.float32)
    routes = _route_seq(rng, repeats, tokens, s["n_expert"], k)
    for a, lws in arms.items():
        pools[a].run_layer(x, *routes[0], lws[-1])  # compile / warm
    quiet = wait_for_idle() if wait_quiet else None
    times = {a: [] for a in arms}
    nbytes, gbytes, phases = {}, {}, {}
    c = 0  # calls so far: each call takes the next layer copy, so that arms sharing a layout's
    # copies never find the experts the call before them just read still in the LLC
    for i, r in enumerate(routes):
        order = list(arms) if i % 2 == 0 else list(arms)[::-1]
        for a in order:
            lws, pool = arms[a], pools[a]
            t0 = time.perf_counter()
            pool.run_layer(x, *r, lws[c % len(lws)])
            c += 1
            times[a].append(time.perf_counter() - t0)
            ph = pool.last_phases()
            if ph is not None:
                phases.setdefault(a, []).append(ph)
            nbytes.setdefault(a, []).append(pool.last_bytes)
            gbytes.setdefault(a, []).append(pool.last_gguf_bytes)
    host = host_read_bandwidth(threads)
    rows = []
    for lay, ts in times.items():
        # bytes per call averaged over the (shared) routings; GB/s from the totals
        nb, gb = float(np.mean(nbytes[lay])), float(np.mean(gbytes[lay]))
        sec, mean = float(np.median(ts)), float(np.mean(ts))
        lw = arms[lay][0]
        rows.append(
            {
                "arm": "cpu-pool-layout-ab",
                "shape": shape,
                "quant": fmt(quant).name,
                "layout": f"{lw.gate.layout}/{lw.up.layout}/{lw.down.layout}"
                + "".join("@" + o for o in lay.split("@")[1:]),
                "prefetch_bytes": pools[lay].prefetch_bytes,
                "units": pools[lay].units,
                "down_units": pools[lay].down_units,
                "wait_prefetch": pools[lay].wait_prefetch,
                "down_by_expert": pools[lay].down_by_expert,
                "eager_quant": pools[lay].eager_quant,
                "pipeline": pools[lay].pipeline,
                "tail_split": pools[lay].tail_split,
                "team": pools[lay].team,
                "prefetch_l2": pools[lay].prefetch_l2,
                "kernels": [lw.gate.kernel, lw.up.kernel, lw.down.kernel],
                "threads": threads,
                "tokens": tokens,
                "repeats": repeats,
                "layer_copies": len(arms[lay]),
                "seconds": sec,
                "seconds_best": min(ts),
                "seconds_mean": mean,
                **phase_summary(phases.get(lay, [])),
                **_rates(gb, nb, sec, host),
                "waited_for_quiet": quiet,
                **_stamp(),
            }
        )
    if print_table:
        print(format_layout_ab(rows))
    return rows


def phase_summary(calls: list[dict]) -> dict:
    """Per phase of `ExpertPool.last_phases` (one dict a call): the median over calls of the
    slowest, mean and fastest thread's microseconds (the slowest thread sets a phase's time;
    max - min is its imbalance) under "phases_us"; the slowest call's phases by thread
    ("slowest_call_us": which thread, which phase) and the count of calls over twice the
    median. Empty when no call recorded phases."""
    if not calls:
        return {}
    totals = np.array([c["total"][0] for c in calls])
    worst = calls[int(np.argmax(totals))]
    out = {
        "slowest_call_us": {k: [round(float(x), 1) for x in v] for k, v in worst.items()},
        "calls_over_2x_median": int((totals > 2 * np.median(totals)).sum()),
        "phases_us": {},
    }
    for k in calls[0]:
        v = np.array([c[k] for c in calls])  # [calls, threads]
        out["phases_us"][k] = {
            "max": float(np.median(v.max(axis=1))),
            "mean": float(np.median(v.mean(axis=1))),
            "min": float(np.median(v.min(axis=1))),
        }
    return out


def format_phases(rows: list[dict]) -> str:
    """The `phases_us` of layout A/B rows as a table: slowest / mean / fastest thread a phase."""
    rows = [r for r in rows if r.get("phases_us")]
    if not rows:
        return ""
    names = list(rows[0]["phases_us"])
    lines = ["arm | T | " + " | ".join(names), "--- | ---: |" + " ---: |" * len(names)]
    for r in rows:
        ph = r["phases_us"]
        cells = [
            f"{ph[k]['max']:.1f}"
            if k == "total"
            else f"{ph[k]['max']:.1f}/{ph[k]['mean']:.1f}/{ph[k]['min']:.1f}"
            for k in names
        ]
        lines.append(f"{r['quant']} {r['layout']} | {r['tokens']} | " + " | ".join(cells))
    for r in rows:  # the slowest call of each arm: the phase that took the time, by thread
        worst = r["slowest_call_us"]
        top = max((k for k in worst if k != "total"), key=lambda k: max(worst[k]))
        lines.append(
            f"\n{r['quant']} {r['layout']}: {r['calls_over_2x_median']} calls over 2x the median;"
            f" the slowest {worst['total'][0]:.1f} us, most of it in {top}"
            f" (us by thread: {worst[top]})"
        )
    return "\n".join(lines)


def format_layout_ab(rows: list[dict]) -> str:
    head = (
        f"{'quant':<8} {'layout':<22} {'thr':>3} {'T':>3} {'ms med':>8} {'ms best':>8} "
        f"{'ms mean':>8} "
        f"{'GB/s gguf':>9} {'GB/s read':>9} {'host GB/s':>9} {'ratio gguf':>10}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['quant']:<8} {r['layout']:<22} {r['threads']:>3} {r['tokens']:>3} "
            f"{1e3 * r['seconds']:>8.3f} {1e3 * r['seconds_best']:>8.3f} "
            f"{1e3 * r['seconds_mean']:>8.3f} {r['gbps_gguf']:>9.2f} "
            f"{r['gbps_read']:>9.2f} {r['host_read_gbps']:>9.2f} {r['ratio_gguf']:>10.2f}"
        )
    return "\n".join(lines)


def format_table(results: list[dict]) -> str:
    head = (
        f"{'shape':<14} {'quant':<8} {'layout':<14} {'thr':>3} {'T':>4} {'K':>2} "
        f"{'experts':>7} {'MB gguf':>8} {'MB read':>8} {'ms':>8} {'GB/s gguf':>9} "
        f"{'GB/s read':>9} {'host GB/s':>9} {'ratio':>6} {'own GB/s':>8} {'ratio':>6} {'tok/s':>6}"
    )
    lines = [head]
    for r in results:
        tps = r.get("decode_tok_s_all_cpu")
        own, ro = r.get("weights_read_gbps"), r.get("ratio_gguf_weights")
        sv = r.get("served_seconds")
        lines.append(
            f"{r['shape']:<14} {r['quant']:<8} {r['layout']:<14} {r['threads']:>3} "
            f"{r['tokens']:>4} {r['experts_per_token']:>2} {r['active_experts']:>7} "
            f"{r['weight_bytes_gguf'] / 1e6:>8.2f} {r['weight_bytes_read'] / 1e6:>8.2f} "
            f"{r['seconds'] * 1e3:>8.3f} {r['gbps_gguf']:>9.2f} {r['gbps_read']:>9.2f} "
            f"{r['host_read_gbps']:>9.2f} {r['ratio_gguf']:>6.2f} "
            f"{(f'{own:.2f}' if own else '-'):>8} {(f'{ro:.2f}' if ro else '-'):>6} "
            f"{(f'{tps:.1f}' if tps else '-'):>6}"
        )
        if sv:  # the same layers through the engine's step server
            lines.append(
                f"{'  served':<14} {'':<8} {'(a step a call)':<14} {'':>3} {'':>4} {'':>2} "
                f"{'':>7} {'':>8} {'':>8} {sv * 1e3:>8.3f} {r['served_gbps_gguf']:>9.2f} "
                f"{'':>9} {'':>9} {r['served_ratio_gguf']:>6.2f} {'':>8} "
                f"{r['served_ratio_gguf_weights']:>6.2f} {r['served_decode_tok_s_all_cpu']:>6.1f}"
            )
    return "\n".join(lines)
