"""A queued decode step's misses served in one compiled call (strata/cpu/serve.py) against the
Python round a layer (STRATA_POOL_SERVE=0), in one process: blocks of decode steps alternate
between the two, so both see the same memory placement and host (whole processes of one arm
differ by 10-25% on the H200's guest). Needs a GPU tier (the queued step is CUDA's).

    python bench/serve_ab.py --model M [--pack P] [--expert-cache 0] [--blocks 8] [--steps 32]

Prints a JSON line: median tok/s and per-layer window split of each arm, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from strata.bench.common import commit
from strata.config import resolve
from strata.engine.builder import build_engine
from strata.model.loader import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--pack", default=None)
    ap.add_argument("--expert-cache", default="0", help="resident experts: 0 = all in the pool")
    ap.add_argument("--vram-budget-mib", type=int, default=10240)
    ap.add_argument("--car-threshold", type=float, default=1.0)
    ap.add_argument("--blocks", type=int, default=8, help="blocks of each arm")
    ap.add_argument("--steps", type=int, default=32, help="decode steps a block")
    ap.add_argument("--prompt", type=int, default=32)
    ns = ap.parse_args()
    model = load_model(ns.model)
    a = model.args
    n_ctx = ns.prompt + (2 * ns.blocks + 2) * ns.steps + 8
    flags = dict(
        expert_cache=ns.expert_cache,
        car_threshold=ns.car_threshold,
        vram_budget_mib=ns.vram_budget_mib,
        adapt_swaps=0,
        n_ctx=n_ctx,
    )
    if ns.pack:
        flags["pack"] = ns.pack
    engine = build_engine(model, resolve(flags, env={}))
    rng = np.random.default_rng(0)
    logits = engine.forward(rng.integers(0, a.n_vocab, ns.prompt).tolist())
    tok = int(np.argmax(logits))
    arms = {"compiled": True, "python": False}
    tps: dict[str, list[float]] = {k: [] for k in arms}
    win: dict[str, list[np.ndarray]] = {k: [] for k in arms}
    for b in range(2 * ns.blocks + 2):  # the first two blocks warm up (compile, capture)
        name = list(arms)[b % 2]
        engine.miss_runner.serve = arms[name]  # (STRATA_POOL_SERVE at start)
        engine._server = None  # the engine asks the miss runner again
        st = engine.stats
        w0 = np.array([st.window_s, st.wait_s, st.route_s, st.pool_s, st.window_layers])
        t0 = time.perf_counter()
        for _ in range(ns.steps):
            tok = engine.decode_greedy(tok)
        dt = time.perf_counter() - t0
        w1 = np.array([st.window_s, st.wait_s, st.route_s, st.pool_s, st.window_layers])
        if b >= 2:
            tps[name].append(ns.steps / dt)
            win[name].append(w1 - w0)
        served = engine._server is not None and engine._server[1] is not None
        if name == "compiled" and not served:
            raise SystemExit("serve_ab: the engine has no step server here (no team / no GPU?)")
    res = {"commit": commit(), "model": ns.model, "expert_cache": ns.expert_cache}
    res.update(blocks=ns.blocks, steps=ns.steps, pool_threads=engine.miss_runner.pool.n_threads)
    for name in arms:
        w = np.sum(win[name], axis=0)
        n = max(w[4], 1)
        res[name] = {
            "tps_median": statistics.median(tps[name]),
            "tps": [round(v, 2) for v in tps[name]],
            "window_ms": 1e3 * w[0] / n,
            "wait_ms": 1e3 * w[1] / n,
            "route_ms": 1e3 * w[2] / n,
            "pool_ms": 1e3 * w[3] / n,
        }
    res["compiled_over_python"] = res["compiled"]["tps_median"] / res["python"]["tps_median"]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
