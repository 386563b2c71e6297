"""Engine arms: whole-model prefill + decode under one configuration, warm, repeated.

car-off  - partial expert cache (what the VRAM budget leaves), CAR at 1.0
car-on   - the same cache, CAR at its default threshold (0.35)
all-cpu  - no resident experts: every expert in the miss path
all-gpu  - every expert resident
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from strata.build import build_engine
from strata.config import resolve
from strata.model.loader import load_model
from strata.progress import bar
from strata.routing.car import DEFAULT_THRESHOLD
from strata.routing.profile import usage_entropy

# what each arm sets; everything else is the server's engine default (EngineConfig: the adaptive
# cache's swaps, prefill offload, CUDA graphs), resolved as `strata serve` resolves it
ARMS = {
    "car-off": {"expert_cache": "auto", "car_threshold": 1.0},
    "car-on": {"expert_cache": "auto", "car_threshold": DEFAULT_THRESHOLD},
    "all-cpu": {"expert_cache": "0", "car_threshold": 1.0},
    "all-gpu": {"expert_cache": "all", "car_threshold": 1.0},
}


def token_ranges(n_vocab: int, shift: bool) -> tuple[tuple[int, int], tuple[int, int]]:
    """(calibration, measured) token id ranges: the whole vocabulary for both, or with `shift`
    the first half for the calibration and the second for the measured prompt and decode (a
    `--routing-entropy` synthetic model routes the two halves differently)."""
    if not shift:
        return (0, n_vocab), (0, n_vocab)
    half = n_vocab // 2
    return (0, half), (half, n_vocab)


def run_engine_arm(
    arm: str,
    model_path,
    prompt_tokens: int,
    gen_tokens: int,
    repeats: int,
    budget_mib: int = 10240,
    extra: dict | None = None,
    calibrate: bool = False,
    prefill_once: bool = False,
    shift: bool = False,
) -> dict[str, Any]:
    """One arm, warm, `repeats` times. The decode feeds random tokens as llama-bench's tg does
    (the step still picks the greedy token): a synthetic model's own greedy text repeats itself
    and would flatter any cache. `shift` calibrates (`calibrate`) on one half of the vocabulary
    and measures on the other."""
    model = load_model(model_path)
    a = model.args
    flags = dict(ARMS[arm], vram_budget_mib=budget_mib, n_ctx=prompt_tokens + gen_tokens + 8)
    flags.update(extra or {})
    cfg = resolve(flags, env={})
    _free_device_pool()  # the previous arm's arrays: cached by CuPy, not in use
    used0 = _device_used()
    engine = build_engine(model, cfg)
    cal_range, (lo, hi) = token_ranges(a.n_vocab, shift)
    if (calibrate or shift) and not engine.resident.all() and engine.resident.any():
        _place_by_calibration(engine, prompt_tokens, cal_range)
    decode_hist = np.zeros_like(engine.stats.expert_hist)
    prefill, decode, hits, decode_hits, subst, windows = [], [], [], [], [], []
    peak = 0
    expert_bytes = model.expert_bytes_per_token()
    first = None  # the prompt's last logits (prefill_once)
    up0, swaps0, disk0 = _uploaded(engine), engine.stats.swaps, _disk_read()
    with bar(repeats + 1, f"{arm}", unit="run") as pb:
        for r in range(repeats + 1):  # run 0 warms up (compilation, slot fills, graph capture)
            if engine.adaptive is not None:
                engine.adaptive.new_window()  # each run is one request
            # each run its own prompt (unused where prefill_once keeps run 0's) and decode
            # tokens: a cache must not learn the very tokens it is measured on
            rng = np.random.default_rng(r)
            prompt = rng.integers(lo, hi, prompt_tokens).tolist()
            stream = rng.integers(lo, hi, gen_tokens).tolist()  # the decode's input tokens
            s0 = _snapshot(engine)
            w0 = _windows(engine.stats)
            t0 = time.perf_counter()
            if prefill_once and r:  # the prompt's KV rows are kept: decode again from them
                engine.reset(keep=prompt_tokens)
                logits = first
            else:
                engine.reset()
                logits = first = engine.forward(prompt)
            t1 = time.perf_counter()
            hist0, s1 = engine.stats.expert_hist.copy(), _snapshot(engine)
            engine.decode_greedy(int(np.argmax(logits)))
            for tok in stream[1:]:  # the greedy pick (on a GPU tier: on the card) is not fed
                engine.decode_greedy(tok)
            t2 = time.perf_counter()
            decode_hist += engine.stats.expert_hist - hist0
            if used0 is not None:
                peak = max(peak, _device_used() - used0)
            if r == 0 and prefill_once:
                prefill.append(prompt_tokens / (t1 - t0))  # the one prefill (a first run)
            if r:
                if not prefill_once:
                    prefill.append(prompt_tokens / (t1 - t0))
                decode.append(gen_tokens / (t2 - t1))
                d = _delta(engine, s0)
                hits.append(d["hit_rate"])
                decode_hits.append(_delta(engine, s1)["hit_rate"])
                subst.append(d["substitution_rate"])
                windows.append(_windows(engine.stats) - w0)
            pb.update()
    med = statistics.median(decode)
    miss_bytes = (1 - statistics.median(hits)) * expert_bytes
    w = np.sum(windows, axis=0)  # [layers, window, wait, route, pool] summed over the runs
    split = {k: 1e3 * w[j + 1] / w[0] if w[0] else None for j, k in enumerate(WINDOW_PARTS)}
    return {
        "arm": arm,
        "model": str(model_path),
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "repeats": repeats,
        "tier": engine.tier.name,
        "prefill_tps": statistics.median(prefill),
        "decode_tps": med,
        "decode_tps_min": min(decode),
        "decode_tps_max": max(decode),
        "window_ms": 1000.0 / med / a.n_layer,
        "hit_rate": statistics.median(hits),  # prompt and decode picks
        "decode_hit_rate": statistics.median(decode_hits),
        # normalized usage entropy of the decode's router picks, the mean over layers (1 =
        # uniform; trained models 0.905-0.960)
        "decode_usage_entropy": float(np.mean([usage_entropy(h) for h in decode_hist])),
        "car_substitution_rate": statistics.median(subst),
        # the CAR rule and the window it measured (card us, pool us a missed expert, slack jobs)
        "car_mode": cfg.car_mode if cfg.car_threshold < 1.0 else None,
        "car_slack": engine.stats.slack.summary(),
        "expert_bytes_per_token": expert_bytes,
        "miss_expert_gbps": miss_bytes * med / 1e9,
        # weights the device tier reads per decode token: the dense path (the embedding table
        # only where it is also the output head) and the resident experts' share
        "tier_weight_gbps": (_dense_read_bytes(model) + (expert_bytes - miss_bytes)) * med / 1e9,
        "resident_experts": int(engine.resident.sum()),
        "graph_steps": engine.stats.graph_steps,
        # prompt picks the cache missed that ran on the card's staging slots (--prefill-offload)
        "prefill_offloaded_picks": engine.stats.offloaded,
        "prefill_stage_slots": int(getattr(engine.tier, "stage_n", 0)),
        # the adaptive cache over all runs (warm-up included): swaps, expert bytes sent to the
        # card, bytes this process read from storage (page-cache misses: experts re-read)
        "adapt_swaps": engine.stats.swaps - swaps0,
        "expert_bytes_uploaded": _uploaded(engine) - up0,
        "disk_read_bytes": _disk_read() - disk0 if disk0 is not None else None,
        # decode misses split between the CPU pool and the PCIe link (eager decode windows;
        # over all runs): distinct missed experts a window, and the link's measured rates
        **_split_row(engine),
        # the CPU pool's distinct experts a decode layer-window and each helper card's
        # (ordinal, slots, hits) over all runs (warm-up included); the decode step's kind
        **_tier_row(engine, cfg),
        # per-layer decode window split (graph decode steps; None on eager paths)
        **{f"win_{k}_ms": v for k, v in split.items()},
        "peak_device_mib": peak / MIB if used0 is not None else None,
        "vram_budget_mib": budget_mib,
        "calibrated_placement": bool(calibrate or shift),
        "shift": bool(shift),
        "adapt_swaps_per_request": cfg.adapt_swaps,
        "prefill_once": bool(prefill_once),
        "notices": cfg.notices,
    }


WINDOW_PARTS = ("window", "wait", "route", "pool")
MIB = 1 << 20


def _split_row(engine) -> dict:
    st, sp = engine.stats, getattr(engine.moe, "split", None)
    per = st.split_per_window()
    row = {
        "split_windows": st.split_windows,
        "split_pool_per_window": per["pool"],
        "split_pcie_per_window": per["pcie"],
        "pcie_link_gbps": None,
        "pcie_gather_gbps": None,
    }
    if sp is not None:
        row["pcie_link_gbps"] = 1e-9 / sp.link_s_per_byte if sp.link_s_per_byte else None
        row["pcie_gather_gbps"] = 1e-9 / sp.gather_s_per_byte if sp.gather_s_per_byte else None
    return row


def _tier_row(engine, cfg) -> dict:
    from strata.engine.helpers import TieredMissRunner

    mr, st = engine.miss_runner, engine.stats
    helpers = mr.helpers if isinstance(mr, TieredMissRunner) else []
    return {
        "decode_step": engine.step.kind,
        "cpu_experts_per_window": st.cpu_experts_per_window(),
        "helper_cache": cfg.helper_cache,
        "helpers": [
            (h.index, h.n_slots, hits) for h, hits in zip(helpers, st.helper_hits, strict=True)
        ],
    }


def _windows(st) -> np.ndarray:
    return np.array([st.window_layers, st.window_s, st.wait_s, st.route_s, st.pool_s])


def _dense_read_bytes(model) -> int:
    """Dense weight bytes one decode token reads: all but the embedding table (one row), which
    counts where it is tied to the output head."""
    from gguf.constants import MODEL_TENSOR as MT
    from gguf.constants import TENSOR_NAMES

    embd = model.gguf.tensors.get(f"{TENSOR_NAMES[MT.TOKEN_EMBD]}.weight")
    tied = not model.has(f"{TENSOR_NAMES[MT.OUTPUT]}.weight")
    return model.dense_bytes() - (0 if tied or embd is None else embd.nbytes)


def measure_bandwidths(threads: int = 0) -> dict:
    """The ceilings engine rows are read against, measured in the same run: the host's parallel
    read bandwidth (all pool threads) and, with a GPU, the device-to-device copy bandwidth."""
    import numba

    from strata.cpu.bandwidth import host_read_bandwidth

    n = threads or numba.config.NUMBA_NUM_THREADS
    out = {"host_read_gbps": host_read_bandwidth(n, repeats=3)["gbps"], "host_threads": n}
    try:
        from strata.gpu.device import import_cupy, primary_device

        cp = import_cupy()
        if cp is not None and primary_device() is not None:
            from strata.bench.gpu_kernels import _copy_gbps, _Timer

            out["device_copy_gbps"] = max(_copy_gbps(cp, _Timer(cp)).values())  # read + write
            _free_device_pool()
    except Exception as e:  # no usable device: the host ceiling alone
        out["device_error"] = " ".join(str(e).split())
    return out


def _uploaded(engine) -> int:
    return int(getattr(engine.tier, "expert_bytes_uploaded", 0))


def _disk_read() -> int | None:
    """Bytes this process caused to be read from storage (Linux /proc/self/io), else None."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _free_device_pool() -> None:
    import gc
    import sys

    gc.collect()
    cp = sys.modules.get("cupy")
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()


def _device_used() -> int | None:
    """Bytes in use on the primary GPU (all processes), or None without one."""
    try:
        from strata.gpu.device import import_cupy, primary_device

        cp = import_cupy()
        if cp is None or primary_device() is None:
            return None
        free, total = cp.cuda.runtime.memGetInfo()
        return int(total - free)
    except Exception:
        return None


def _place_by_calibration(engine, n_tokens: int, ids: tuple[int, int]) -> None:
    """Fill the expert cache by a usage profile counted over a separate calibration prompt
    (random tokens in [lo, hi) of another seed), as `strata profile` + `--profile` would."""
    from strata.routing.profile import place

    engine.reset()
    hist0 = engine.stats.expert_hist.copy()
    prompt = np.random.default_rng(1).integers(*ids, max(64, n_tokens)).tolist()
    engine.forward(prompt[: engine.n_ctx - 1])
    counts = engine.stats.expert_hist - hist0
    want = place(counts, int(engine.resident.sum()))
    engine.resident[:] = (
        engine.tier.load_resident(want) if hasattr(engine.tier, "load_resident") else want
    )
    engine.reset()


def _snapshot(engine) -> tuple[int, int, int, int]:
    st = engine.stats
    return st.hits, st.misses, st.substitutions, st.decode_misses_before_car


def _delta(engine, s0) -> dict[str, float]:
    h, m, s, dm = (b - a for a, b in zip(s0, _snapshot(engine), strict=True))
    return {"hit_rate": h / (h + m) if h + m else 0.0, "substitution_rate": s / dm if dm else 0.0}
