"""`python -m strata.bench --arm ARM [...]`: one table per run, JSON on request.

Arms: car-off, car-on, all-cpu, all-gpu (whole model, prefill + decode), batch (decode tok/s
of B sequences at once through the server's runner, B = --batch-sizes), llama-cpp (llama.cpp
through llama-cpp-python on the same file, timed the same way), car-quality (CAR's cost
on perplexity/KL, teacher-forced), cpu-pool (the CPU expert pool alone), gpu-kernels (device
kernels alone). Each result carries machine, commit and date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from strata.bench.common import EMBEDDED_MODEL, stamp, synthetic_model, write_json

ENGINE_ARMS = ("car-off", "car-on", "all-cpu", "all-gpu")
ARMS = ENGINE_ARMS + ("batch", "llama-cpp", "car-quality", "cpu-pool", "gpu-kernels")
BENCH_ROUTING_ENTROPY = 0.93  # --synthetic's routing: inside the trained models' 0.905-0.960


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m strata.bench", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--arm", action="append", required=True, choices=ARMS, help="arm to run (repeatable)"
    )
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", help="GGUF file (default: the embedded model)")
    src.add_argument("--synthetic", metavar="SHAPE", help="synthetic model shape (cached)")
    src.add_argument("--shape", help="shape for the cpu-pool arm (no model file needed)")
    ap.add_argument("--quant", default="IQ3_XXS", help="expert quant of --synthetic/--shape")
    ap.add_argument(
        "--routing-entropy",
        type=float,
        default=None,
        metavar="H",
        help=f"--synthetic: routers solved for this normalized per-layer usage entropy (default "
        f"{BENCH_ROUTING_ENTROPY} where --skew is not given; trained models 0.905-0.960)",
    )
    ap.add_argument(
        "--skew",
        type=float,
        default=None,
        help="--synthetic: expert popularity skew instead (0 = uniform routing)",
    )
    ap.add_argument("--layers", type=int, default=None, help="override the synthetic layer count")
    ap.add_argument("--vram-budget-mib", type=int, default=10240)
    ap.add_argument(
        "--vram-budget-widen",
        action="store_true",
        help="allow a budget outside 1281..10240 MiB (e.g. all-gpu on a model past 10 GiB)",
    )
    ap.add_argument(
        "--expert-cache",
        default=None,
        help="resident experts for car-off/car-on (default: what the budget leaves)",
    )
    ap.add_argument(
        "--helper-cache",
        default=None,
        metavar="DEV=auto|N[,...]",
        help="car-off/car-on: expert caches on GPUs other than the primary (docs/SECOND_GPU.md)",
    )
    ap.add_argument(
        "--adapt-swaps",
        type=int,
        default=None,
        help="engine arms: adaptive cache swaps per request (default: the server's; 0 = static)",
    )
    ap.add_argument(
        "--no-cuda-graphs", action="store_true", help="engine arms: eager launches on a GPU tier"
    )
    ap.add_argument("--pack", default=None, help="engine arms: the CPU pool reads this pack")
    ap.add_argument(
        "--kv-type",
        default=None,
        choices=["f16", "int8"],
        help="engine arms: KV cache f16 (default) or int8 with a scale per row",
    )
    ap.add_argument(
        "--prefill-offload",
        default=None,
        metavar="auto|off|N",
        help="engine arms: a prompt's missed experts on the card from N staging slots "
        "(default auto: 64) or in the CPU pool (off)",
    )
    ap.add_argument(
        "--calibrate",
        action="store_true",
        help="car-off/car-on: place the expert cache by a usage profile of a calibration prompt",
    )
    ap.add_argument(
        "--shift",
        action="store_true",
        help="car-off/car-on: calibrate (as --calibrate) on the first half of the vocabulary and "
        "measure prompt and decode on the second",
    )
    ap.add_argument(
        "--prefill-once",
        action="store_true",
        help="engine arms: prefill the prompt once (timed: its first run) and repeat only the "
        "decode from its KV rows (long prompts)",
    )
    ap.add_argument("-p", "--prompt-tokens", type=int, default=64)
    ap.add_argument("-n", "--gen-tokens", type=int, default=32)
    ap.add_argument(
        "-r",
        "--repeats",
        type=int,
        default=None,
        help="timed repeats, median reported (default 3; cpu-pool 20: one call is < 1 ms)",
    )
    ap.add_argument("-t", "--tokens", type=int, default=1, help="tokens per call (cpu-pool)")
    ap.add_argument(
        "--batch-sizes", default="1,2,4,8,16", help="batch: the batch sizes B (comma list)"
    )
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all)")
    ap.add_argument(
        "--car-mode",
        default=None,
        choices=["slack", "ratio"],
        help="car-on: the CAR rule (default: the engine's, slack)",
    )
    ap.add_argument("--prompts", type=int, default=20, help="car-quality: generation prompts")
    ap.add_argument(
        "--thresholds", default="0.35", help="car-quality: thresholds of the seeds' rule (ratio)"
    )
    ap.add_argument(
        "--text", default=None, help="car-quality: a text file (default: the held-out windows)"
    )
    ap.add_argument(
        "--residency", default="0.33,0.5,0.8", help="car-quality: shares of experts resident"
    )
    ap.add_argument(
        "--car-window",
        default="67,30",
        metavar="CARD_US,JOB_US",
        help="car-quality: the card's window and the pool's time a missed expert that the slack "
        "rule is given (a CPU-only run has no card to time; default: the GPU machine's IQ3_XXS "
        "figures)",
    )
    ap.add_argument(
        "--max-tokens", type=int, default=None, help="car-quality: score at most N tokens"
    )
    ap.add_argument(
        "--peer-extra-bufts",
        default="auto",
        choices=["auto", "1", "0"],
        help="llama-cpp: llama.cpp's extra weight buffer types (auto: on, but on an AMX CPU only "
        "if a probe eval survives them)",
    )
    ap.add_argument(
        "--commit",
        default=None,
        help="commit stamped on the results (default: `git rev-parse --short HEAD` where the "
        "tree has git; pass it for a copy of the tree without .git)",
    )
    ap.add_argument(
        "--cache-dir", default=None, help="where synthetic models are cached (~/.cache/strata)"
    )
    ap.add_argument("--json", dest="json_path", default=None, help="write results as JSON")
    return ap


def _repeats(ns, default: int) -> int:
    """-r/--repeats, or the arm's default where it was not given."""
    return default if ns.repeats is None else ns.repeats


def _model_path(ns) -> Path:
    if ns.synthetic:
        entropy = ns.routing_entropy
        if entropy is None and ns.skew is None:
            entropy = BENCH_ROUTING_ENTROPY
        return synthetic_model(
            ns.synthetic,
            ns.quant,
            ns.skew or 0.0,
            layers=ns.layers,
            cache_dir=ns.cache_dir,
            routing_entropy=entropy,
        )
    if ns.model:
        return Path(ns.model)
    return EMBEDDED_MODEL


def _ms(v) -> str:
    return f"{v:6.3f}" if isinstance(v, int | float) else f"{'-':>6}"


def _h(v) -> str:
    return f"{v:5.3f}" if isinstance(v, int | float) else f"{'-':>5}"


def _engine_table(rows: list[dict]) -> str:
    head = (
        f"{'arm':10} {'prefill t/s':>11} {'decode t/s (min-max)':>24} {'window ms':>9} "
        f"{'wait':>6} {'route':>6} {'pool':>6} "
        f"{'hit %':>6} {'CAR %':>6} {'H dec':>5} {'miss GB/s':>9} {'peak MiB':>8} {'tier':>5}"
    )
    lines = [head]
    for r in rows:
        peak = r.get("peak_device_mib")
        lines.append(
            f"{r['arm']:10} {r['prefill_tps']:11.1f} {r['decode_tps']:8.1f} "
            f"({r['decode_tps_min']:6.1f}-{r['decode_tps_max']:6.1f}) {r['window_ms']:9.3f} "
            f"{_ms(r.get('win_wait_ms'))} {_ms(r.get('win_route_ms'))} {_ms(r.get('win_pool_ms'))} "
            f"{100 * r['hit_rate']:6.1f} {100 * r['car_substitution_rate']:6.1f} "
            f"{_h(r.get('decode_usage_entropy'))} "
            f"{r['miss_expert_gbps']:9.3f} {'-' if peak is None else str(round(peak)):>8} "
            f"{r['tier']:>5}"
        )
    lines.append(
        "window ms = wall time per layer and decode token; wait/route/pool: per-layer time "
        "blocked on the card, routing on the host, the CPU pool (graph decode only); H dec: "
        "the decode's normalized expert usage entropy (mean over layers)"
    )
    return "\n".join(lines)


def _arm_extra(ns, arm: str) -> dict:
    extra: dict = {"cuda_graphs": not ns.no_cuda_graphs}
    if ns.adapt_swaps is not None:
        extra["adapt_swaps"] = ns.adapt_swaps
    if ns.pack:
        extra["pack"] = ns.pack
    if ns.kv_type:
        extra["kv_type"] = ns.kv_type
    if ns.prefill_offload:
        extra["prefill_offload"] = ns.prefill_offload
    if ns.vram_budget_widen:
        extra["vram_budget_widen"] = True
    if ns.car_mode and arm == "car-on":
        extra["car_mode"] = ns.car_mode
    if ns.expert_cache and arm in ("car-off", "car-on"):
        extra["expert_cache"] = ns.expert_cache
    if ns.helper_cache and arm in ("car-off", "car-on"):
        extra["helper_cache"] = ns.helper_cache
    return extra


def _run_arm(ns, arm: str, doc: dict, engine_rows: list[dict]) -> None:
    if arm in ENGINE_ARMS:
        from strata.bench.engine_arms import run_engine_arm

        engine_rows.append(
            run_engine_arm(
                arm,
                _model_path(ns),
                ns.prompt_tokens,
                ns.gen_tokens,
                _repeats(ns, 3),
                ns.vram_budget_mib,
                _arm_extra(ns, arm),
                calibrate=ns.calibrate,
                prefill_once=ns.prefill_once,
                shift=ns.shift,
            )
        )
        doc["results"].append(engine_rows[-1])
    elif arm == "batch":
        from strata.bench.batch_arm import batch_table, parse_batch_sizes, run_batch_arm

        res = run_batch_arm(
            _model_path(ns),
            ns.prompt_tokens,
            ns.gen_tokens,
            _repeats(ns, 3),
            parse_batch_sizes(ns.batch_sizes),
            ns.vram_budget_mib,
            _arm_extra(ns, arm),
        )
        doc["results"].append(res)
        print(batch_table(res))
    elif arm == "llama-cpp":
        from strata.bench.peer import run_llama_cpp_arm

        engine_rows.append(
            run_llama_cpp_arm(
                _model_path(ns),
                ns.prompt_tokens,
                ns.gen_tokens,
                _repeats(ns, 3),
                ns.threads,
                ns.peer_extra_bufts,
            )
        )
        doc["results"].append(engine_rows[-1])
    elif arm == "car-quality":
        from strata.bench.car_quality import quality_table, run_car_quality

        text = Path(ns.text).read_text() if ns.text else None
        try:
            ths = [float(t) for t in ns.thresholds.split(",") if t]
            shares = tuple(float(t) for t in ns.residency.split(",") if t)
            window = tuple(float(t) for t in ns.car_window.split(","))
        except ValueError:
            raise SystemExit("--thresholds, --residency and --car-window take numbers") from None
        res = run_car_quality(
            _model_path(ns),
            ths,
            shares,
            window,
            text=text,
            max_tokens=ns.max_tokens,
            gen_tokens=ns.gen_tokens,
            n_prompts=ns.prompts,
        )
        print(quality_table(res))
        doc["results"].append(res)
    elif arm == "cpu-pool":
        from strata.bench.cpu_pool import run_cpu_pool_arm

        res = run_cpu_pool_arm(
            ns.shape or ns.synthetic or "qwen3-30b-a3b",
            ns.quant,
            ns.tokens,
            ns.threads,
            _repeats(ns, 20),
            commit_id=doc["stamp"]["commit"],
        )
        doc["results"].append(res)
    elif arm == "gpu-kernels":
        from strata.bench.gpu_kernels import run_gpu_kernels_arm

        doc["results"].append(run_gpu_kernels_arm(commit_id=doc["stamp"]["commit"]))


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    ns = ap.parse_args(argv)
    if ns.repeats is not None and ns.repeats < 1:
        ap.error(f"-r/--repeats must be >= 1, got {ns.repeats}")
    if ns.routing_entropy is not None and (ns.skew is not None or not 0 < ns.routing_entropy <= 1):
        ap.error("--routing-entropy must be in (0, 1] and goes without --skew")
    doc = {
        "stamp": stamp(ns.commit),
        "command": "python -m strata.bench " + " ".join(argv or sys.argv[1:]),
        "results": [],
    }
    engine_rows: list[dict] = []
    failed = 0
    if any(a in ENGINE_ARMS for a in ns.arm):
        from strata.bench.engine_arms import measure_bandwidths

        doc["bandwidth"] = measure_bandwidths(ns.threads)
    for arm in ns.arm:
        try:
            _run_arm(ns, arm, doc, engine_rows)
        except (ValueError, OSError, ImportError, RuntimeError) as e:
            # one failed arm (e.g. a cache that cannot fit) does not lose the others' results
            failed += 1
            print(f"strata.bench: error: {arm}: {' '.join(str(e).split())}", file=sys.stderr)
            doc["results"].append({"arm": arm, "error": " ".join(str(e).split())})
    if engine_rows:
        bw = doc.get("bandwidth") or {}
        print(_engine_table(engine_rows))
        if bw:
            dev = bw.get("device_copy_gbps")
            print(
                f"measured in this run: host read {bw['host_read_gbps']:.1f} GB/s "
                f"({bw['host_threads']} threads)"
                + (f", device copy {dev:.0f} GB/s" if dev else ", no device")
            )
            for r in engine_rows:
                if "tier_weight_gbps" not in r:
                    continue
                card = r["tier_weight_gbps"]
                line = f"  {r['arm']}: missed experts {r['miss_expert_gbps']:.2f} GB/s"
                line += f" = {100 * r['miss_expert_gbps'] / bw['host_read_gbps']:.0f}% of host read"
                if dev and r["tier"] != "host":
                    line += f"; card weights {card:.0f} GB/s = {100 * card / dev:.1f}% of copy"
                print(line)
                print(
                    f"  {r['arm']}: CPU experts a decode layer-window "
                    f"{r['cpu_experts_per_window']:.2f} ({r['decode_step']} step)"
                    + "".join(
                        f"; helper GPU {d}: {n} slots, {hits} hits"
                        for d, n, hits in r.get("helpers", [])
                    )
                )
                if r.get("split_windows"):
                    link, gather = r["pcie_link_gbps"] or 0, r["pcie_gather_gbps"] or 0
                    print(
                        f"  {r['arm']}: misses a window: {r['split_pool_per_window']:.2f} experts"
                        f" in the pool, {r['split_pcie_per_window']:.2f} over PCIe (link "
                        f"{link:.1f} GB/s, gather {gather:.1f} GB/s, measured at start)"
                    )
        for r in engine_rows:
            for n in r["notices"]:
                print(f"note ({r['arm']}): {n}")
    s = doc["stamp"]
    print(f"machine: {s['machine']} | commit {s['commit']} | {s['date']}")
    if ns.json_path:
        write_json(ns.json_path, doc)
    return 2 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
