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

from strata.bench.common import commit
from strata.cpu.bandwidth import host_read_bandwidth, read_bandwidth
from strata.cpu.kernels.features import simd_level
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


def make_layer(shape: str, quant: str, seed: int = 0):
    """Random gate/up/down expert tensors of one layer of `shape`, prepared for the pool (in
    the layout the pool's table picks for `quant` on this host)."""
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
    return prepare_layer(*mats)


def layer_copies(lw, min_bytes: int | None = None) -> list:
    """`lw` and copies of its expert bytes in fresh memory, enough that together they are at
    least twice the last-level cache (min_bytes): timed in rotation, each call reads weights
    the cache no longer holds, as a decode step going through all layers does. A single layer
    timed again and again stays partly cached on a host whose LLC is as large as a layer
    (Sapphire Rapids: 300 MiB of L3 against 316 MB of Qwen3-30B-A3B IQ3_XXS experts)."""
    from dataclasses import replace

    from strata.cpu.bandwidth import llc_bytes

    want = 2 * llc_bytes() if min_bytes is None else min_bytes
    one = sum(m.data.nbytes for m in (lw.gate, lw.up, lw.down))
    n = max(1, -(-want // max(one, 1)))
    out = [lw]
    while len(out) < n:
        out.append(
            replace(lw, **{k: replace(getattr(lw, k), data=getattr(lw, k).data.copy())
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
    from strata.cpu.serve import StepServer
    from strata.quant.plan_record import DONE, record_views

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


def _stamp(commit_id: str | None) -> dict:
    return {
        "machine": machine(),
        "commit": commit_id or commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def run_cpu_pool_arm(
    shape: str = "qwen3-30b-a3b",
    quant: str = "IQ3_XXS",
    tokens: int = 1,
    threads: int | None = None,
    repeats: int = 20,
    json_path: str | None = None,
    print_table: bool = True,
    wait_quiet: bool = False,
    commit_id: str | None = None,
) -> dict:
    """Time one layer of `shape` experts in `quant` through the pool (its defaults); report
    GB/s vs the host.

    Returns (and with `json_path` writes) a dict: tokens, experts per token, tasks, active
    experts, weight bytes read (GGUF encoding and the kernels' layout), seconds, achieved GB/s
    both ways, the host read bandwidth of the same run and the ratios, and for T = 1 the decode
    rate all layers would give if every expert ran on the CPU.
    """
    threads = threads or numba.config.NUMBA_NUM_THREADS
    s = SHAPES[shape]
    k, d, n_layer = s["n_expert_used"], s["n_embd"], s["n_layer"]
    lw = make_layer(shape, quant)
    lws = layer_copies(lw)  # rotate through > 2x the LLC: weights come from DRAM
    pool = ExpertPool(threads)
    quiet = wait_for_idle() if wait_quiet else None
    sec, nbytes, gbytes, active = time_pool(pool, lws, d, tokens, k, repeats)
    served = time_served(pool, lws, d, k, repeats) if tokens == 1 else None
    time.sleep(0.05)  # the pool's threads asleep before the read (a team's members spin a while)
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
        **_stamp(commit_id),
    }
    if print_table:
        print(format_table([res]))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=2)
    return res


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
