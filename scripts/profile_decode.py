"""Where a decode token's (or a prompt's) device time goes: per-kernel durations, under ncu.

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
        --log-file ncu.csv python scripts/profile_decode.py run --model M.gguf --tokens 3
    python scripts/profile_decode.py report ncu.csv --tokens 3 --step-ms 5.29

`run` builds the engine (every expert resident unless --expert-cache says otherwise), warms the
decode graph up, then opens the profiler for --tokens greedy steps only (cudaProfilerStart/Stop),
so ncu sees just those steps' kernels, each timed alone (no launch gaps). With --prefill N it
profiles one prompt of N tokens instead (after an unprofiled one of the same length); `report`
then takes --tokens 1 and --step-ms the prompt's time. `report` groups the
kernels by name: launches per token, median and total microseconds per token, and the sum against
the measured step time (--step-ms, e.g. from `strata.bench --arm all-gpu`): what is left over is
launch latency and gaps between the graph's nodes, which kernel time alone does not show.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections import defaultdict


def run(args) -> int:
    import numpy as np

    from strata.build import build_engine
    from strata.config import resolve
    from strata.model.loader import load_model

    model = load_model(args.model)
    flags = dict(
        expert_cache=args.expert_cache,
        car_threshold=1.0,
        vram_budget_mib=args.vram_budget_mib,
        vram_budget_widen=True,
        adapt_swaps=0,
        n_ctx=max(args.prompt + 2 * args.warm + args.tokens, args.prefill) + 8,
    )
    engine = build_engine(model, resolve(flags, env={}))
    cp = engine.tier.cp
    rng = np.random.default_rng(0)
    if args.prefill:
        prompt = rng.integers(0, model.args.n_vocab, args.prefill).tolist()
        engine.forward(prompt)  # compile, fill the slots
        engine.reset()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        engine.forward(prompt)
        cp.cuda.Device().synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        tps = args.prefill / ms * 1e3
        print(f"unprofiled step: {ms:.3f} ms (prompt of {args.prefill}: {tps:.1f} tok/s)")
        engine.reset()
        cp.cuda.runtime.profilerStart()
        engine.forward(prompt)
        cp.cuda.Device().synchronize()
        cp.cuda.runtime.profilerStop()
        return 0
    logits = engine.forward(rng.integers(0, model.args.n_vocab, args.prompt).tolist())
    tok = int(np.argmax(logits))
    for _ in range(args.warm):  # compile, capture the graph, settle clocks
        tok = engine.decode_greedy(tok)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(args.warm):
        tok = engine.decode_greedy(tok)
    cp.cuda.Device().synchronize()
    step_ms = (time.perf_counter() - t0) * 1e3 / args.warm
    print(
        f"unprofiled step: {step_ms:.3f} ms ({1e3 / step_ms:.1f} tok/s), "
        f"graph steps so far {engine.stats.graph_steps}"
    )
    cp.cuda.runtime.profilerStart()
    for _ in range(args.tokens):
        tok = engine.decode_greedy(tok)
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStop()
    return 0


def report(args) -> int:
    rows = _ncu_rows(args.csv)
    if not rows:
        print(f"error: no kernel rows in {args.csv}", file=sys.stderr)
        return 1
    per = defaultdict(list)
    for name, us in rows:
        per[name].append(us)
    total = sum(us for _, us in rows) / args.tokens
    out = [f"{len(rows)} kernels over {args.tokens} tokens; kernel time {total:.1f} us/token"]
    if args.step_ms:
        gap = args.step_ms * 1e3 - total
        out.append(
            f"measured step {args.step_ms * 1e3:.1f} us: {gap:.1f} us/token outside "
            f"kernels ({gap / (len(rows) / args.tokens):.2f} us per launch)"
        )
    out.append(f"{'kernel':<44} {'n/tok':>6} {'median us':>10} {'us/tok':>9} {'share':>6}")
    for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        s = sum(v) / args.tokens
        out.append(
            f"{name[:44]:<44} {len(v) / args.tokens:>6.1f} {statistics.median(v):>10.2f} "
            f"{s:>9.1f} {s / total:>6.1%}"
        )
    print("\n".join(out))
    return 0


def _ncu_rows(path: str) -> list[tuple[str, float]]:
    """(kernel name, microseconds) per profiled launch from ncu's --csv log."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own "==PROF==" lines are not CSV
    out = []
    for rec in csv.DictReader(lines):
        if rec.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(rec["Metric Value"].replace(",", ""))
        unit = rec.get("Metric Unit", "ns")
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3}[unit]
        out.append((rec["Kernel Name"].split("(")[0], v * scale))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="decode under the profiler (start it under ncu)")
    r.add_argument("--model", required=True)
    r.add_argument("--tokens", type=int, default=3, help="profiled decode steps")
    r.add_argument("--warm", type=int, default=16, help="unprofiled steps before (and timed)")
    r.add_argument("--prompt", type=int, default=64, help="prompt tokens before decoding")
    r.add_argument("--prefill", type=int, default=0, help="profile a prompt of N tokens instead")
    r.add_argument("--expert-cache", default="all", help="all (default), auto, 0 or a count")
    r.add_argument("--vram-budget-mib", type=int, default=40000)
    q = sub.add_parser("report", help="per-kernel table from ncu's CSV log")
    q.add_argument("csv")
    q.add_argument("--tokens", type=int, default=3)
    q.add_argument("--step-ms", type=float, default=0.0)
    args = p.parse_args(argv)
    return run(args) if args.cmd == "run" else report(args)


if __name__ == "__main__":
    sys.exit(main())
