"""Config -> tiers -> engine: `build_engine` picks the tier (`make_tier`: the GPU tier on the
primary device where there is one, else the CPU-only tier), places the expert cache, wires CAR,
the adaptive cache, traces and the CPU pool for the experts the tier does not hold; the engine
then chooses its decode step once (strata/engine/steps).
"""

from __future__ import annotations

import numpy as np

from strata.config import ConfigError, EngineConfig, car_unwired, parse_helpers
from strata.cpu.runner import PoolMissRunner
from strata.engine.engine import Engine
from strata.engine.tier import Tier, is_card
from strata.gpu.device import DeviceError, DeviceInfo, primary_device, say_once
from strata.model.loader import Model
from strata.progress import reporter
from strata.routing.car import CarKnobs
from strata.routing.profile import AdaptiveCache, UsageProfile, place
from strata.routing.tiers import CPU, PRIMARY, TierMap, default_counts, place_tiers

MiB = 1 << 20


def auto_slots(model: Model, budget_mib: int, n_ctx: int, kv_type: str = "f16") -> int:
    """Expert slots that fit the budget after the dense weights and the KV cache."""
    a = model.args
    left = budget_mib * MiB - model.dense_bytes() - model.kv_bytes(n_ctx, kv_type)
    mean_expert = model.total_expert_bytes() / (a.n_expert * a.n_layer)
    return int(max(0, min(left // mean_expert, a.n_expert * a.n_layer)))


def resident_mask(model: Model, slots: int, profile: UsageProfile | None) -> np.ndarray:
    """[L, E]: by profile rank, or without one an equal share of slots per layer (lowest ids)."""
    a = model.args
    if profile is not None:
        return place(profile.counts, slots)
    mask = np.zeros((a.n_layer, a.n_expert), bool)
    per, extra = divmod(slots, a.n_layer)
    for i in range(a.n_layer):
        mask[i, : min(a.n_expert, per + (i < extra))] = True
    return mask


def card_lacks(a) -> str | None:
    """What the GPU tier's kernels lack for model args `a` (qwen3next's DeltaNet layers), or
    None: such a model runs CPU-only (the host tier and the CPU pool have them) until the card
    learns them."""
    return "DeltaNet layers" if a.linear_attn else None


PREFILL_STAGE_AUTO = 64  # staging slots of --prefill-offload auto


def prefill_stage_slots(cfg: EngineConfig, n_expert: int, cpu_pool: bool) -> int:
    """Staging slots for a prompt's missed experts on the card (0: the CPU pool computes them):
    only where some experts live in the pool; never more than a layer's experts."""
    if not cpu_pool or cfg.prefill_offload == "off":
        return 0
    n = PREFILL_STAGE_AUTO if cfg.prefill_offload == "auto" else int(cfg.prefill_offload)
    return min(n, n_expert)


DEVICES = ("auto", "gpu", "host")


def single_threaded_blas() -> None:
    """One BLAS thread from now on: the pool's Numba threads own the cores, and OpenBLAS's
    threads, which spin on after each small host-side matmul, would take them from the pool."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an install without it: BLAS keeps its threads
        return
    threadpool_limits(1, user_api="blas")


def make_tier(
    model: Model,
    n_ctx: int,
    device: str = "auto",
    info: DeviceInfo | None = None,
    vram_budget_mib: int | None = None,
    expert_slots: int | str = "auto",
    widen_budget: bool = False,
    kv_type: str = "f16",
    prefill_stage: int = 0,
) -> Tier:
    """The GPU tier on `info` (the primary device, or None), else the CPU-only tier.

    `device="auto"` falls back to the CPU-only tier (said once) where CuPy or a GPU is missing;
    `device="gpu"` refuses instead; `device="host"` never touches CuPy. `kv_type` ("f16" or
    "int8") is the KV cache's element type on either tier; `prefill_stage` staging slots let a
    prompt's missed experts run on the tier (`experts_staged`)."""
    if device not in DEVICES:
        raise ValueError(f"device must be auto, gpu or host, not {device!r}")
    if model.args.linear_attn and device != "host":  # no DeltaNet kernels on the card yet
        if device == "gpu":
            raise DeviceError(f"--device gpu: {model.args.arch} runs on the CPU-only tier only")
        if info is not None:
            say_once(f"{model.args.arch}: the GPU tier has no DeltaNet layers yet, CPU-only tier")
        info = None
    if device != "host" and info is not None:
        from strata.gpu.budget import DEFAULT_BUDGET_MIB, DeviceBudget
        from strata.gpu.cupy_tier import CupyTier

        budget = DeviceBudget(total_mib=vram_budget_mib or DEFAULT_BUDGET_MIB, widen=widen_budget)
        say_once(f"GPU tier on {info.describe()}, VRAM budget {budget.total_mib} MiB")
        return CupyTier(
            model,
            n_ctx,
            budget,
            expert_slots=expert_slots,
            device=info,
            kv_type=kv_type,
            prefill_stage=prefill_stage,
        )
    if device == "gpu":
        raise DeviceError("--device gpu: no usable GPU (CuPy and a CUDA/ROCm device needed)")
    from strata.cpu.hybrid_tier import make_host_tier

    # the dense matrices on the CPU pool's kernels, from the weights' own bytes
    with reporter("loading dense weights", unit="layer") as progress:
        return make_host_tier(
            model,
            n_ctx,
            kv_type=kv_type,
            prefill_stage=prefill_stage,
            dense="quant",
            progress=progress,
        )


def pool_runner(model: Model, cfg: EngineConfig, skip: np.ndarray) -> PoolMissRunner:
    """The CPU pool as the engine's miss runner: every expert not in `skip` [L, E] copied to
    RAM (or read from the pack) with progress shown."""
    single_threaded_blas()
    with reporter("experts to RAM", cfg.resident_experts, unit="B") as progress:
        return PoolMissRunner(
            model,
            cfg.threads,
            pack=cfg.pack,
            resident_experts=cfg.resident_experts,
            skip=skip,
            release=cfg.release,
            progress=progress,
        )


def car_knobs(cfg: EngineConfig, slots: int, total: int) -> CarKnobs:
    """CAR's knobs from `cfg`, off (with the notice) where every expert or none is resident."""
    if slots >= total:
        car_unwired(cfg, "every expert is resident, no expert runs in the CPU pool")
    elif slots == 0:
        car_unwired(cfg, "no expert is resident, CAR has nothing to substitute")
    return CarKnobs(
        cfg.car_threshold,
        cfg.car_warmup,
        cfg.car_budget,
        cfg.car_free_ratio,
        cfg.car_mode,
        cfg.car_max_weight,
    )


def build_engine(model: Model, cfg: EngineConfig, device_routing: bool = True) -> Engine:
    """The engine `cfg` describes. `device_routing=False` keeps a card's routing on the host
    (the graph steps and prompts route as the CPU-only tier does: tests compare the two)."""
    a = model.args
    n_ctx = cfg.n_ctx or min(a.n_ctx_train, 4096)
    if n_ctx < 1:
        raise ConfigError(f"--ctx must be >= 1, got {n_ctx}")
    total = a.n_layer * a.n_expert
    if cfg.spec > 0 and not a.n_nextn:
        raise ConfigError(
            f"--spec {cfg.spec}: {a.arch} model {model.path.name} has no NextN (MTP) block "
            "to draft with"
        )
    lacks = card_lacks(a)  # qwen3next: CPU-only until the card learns its pieces
    if lacks and cfg.device == "gpu":
        raise ConfigError(f"--device gpu: the GPU tier has no {lacks} yet ({a.arch})")
    card_ok = (cfg.device == "auto" and not lacks) or cfg.device == "gpu"
    info = primary_device(cfg.primary_device) if card_ok else None
    on_gpu = info is not None
    # without a GPU every expert runs in the CPU pool by default: its quantized kernels beat the
    # host tier's emulation of the device in decode and prefill
    cache = cfg.expert_cache or ("auto" if on_gpu else "0")
    if lacks and cfg.device == "auto" and primary_device(cfg.primary_device) is not None:
        say_once(f"{a.arch}: CPU-only (the GPU tier has no {lacks} yet)")
    if cache == "all":
        slots = total
    elif cache == "auto":
        slots = auto_slots(model, cfg.vram_budget_mib, n_ctx, cfg.kv_type)  # host's estimate
    else:
        slots = min(int(cache), total)
    if not on_gpu or slots < total:  # the CPU pool or the host tier runs: its kernels
        from strata.cpu.jitcache import cold
        from strata.cpu.kernels.features import level_name

        if cold():
            say_once(f"compiling CPU kernels for {level_name()}, first run only")
    tier = make_tier(
        model,
        n_ctx,
        "host" if lacks else cfg.device,
        info,
        vram_budget_mib=cfg.vram_budget_mib,
        # auto: what the tier's own budget leaves after weights, KV, workspace and reserves;
        # a device tier keeps room for one token
        expert_slots="auto" if cache == "auto" else max(slots, a.n_expert_used),
        widen_budget=cfg.vram_budget_widen,
        kv_type=cfg.kv_type,
        prefill_stage=prefill_stage_slots(cfg, a.n_expert, on_gpu and slots < total),
    )
    card = is_card(tier)
    if cache == "auto" and card:
        slots = min(int(tier.n_slots), total)
    profile = UsageProfile.load(cfg.profile, a.n_layer, a.n_expert) if cfg.profile else None
    resident = resident_mask(model, slots, profile)
    helpers = open_helper_cards(model, cfg, card and slots < total)
    placed = None  # where each expert lives [L, E] (helper cards only)
    if helpers:
        counts = profile.counts if profile is not None else default_counts(a.n_layer, a.n_expert)
        placed = place_tiers(counts, [slots, *(h.n_slots for h in helpers)])
        resident = placed == PRIMARY  # resident_mask's placement, the helpers' next
    if cfg.spec > 0:  # the verify forward is a multi-token step: CAR acts on decode steps
        car_unwired(cfg, "--spec verifies drafts in multi-token steps, where CAR does not act")
    car = car_knobs(cfg, slots, total)
    adaptive = None
    if slots < total and cfg.adapt_swaps > 0 and slots > 0:
        adaptive = AdaptiveCache(
            resident, max_swaps=cfg.adapt_swaps, warm_from_prompts=profile is None
        )
    if card:  # the GPU tier uploads the placed experts now
        resident[:] = tier.load_resident(resident)
    if placed is not None:  # what the primary could not take runs in the pool; helpers load
        placed[(placed == PRIMARY) & ~resident] = CPU
        if adaptive is not None:  # a helper's experts start warm, as the primary's do
            adaptive.score[placed > PRIMARY] = 1.0
        for d, h in enumerate(helpers, 1):
            h.load(placed == d)
            say_once(h.describe())
    # the experts the tier does not hold run in the CPU pool
    miss_runner = None
    if slots < total:  # the RAM copy leaves out what any card holds
        miss_runner = pool_runner(model, cfg, resident if placed is None else placed != CPU)
        if placed is not None:
            from strata.engine.helpers import TieredMissRunner

            miss_runner = TieredMissRunner(miss_runner, helpers, TierMap(placed, len(helpers)))
    if cfg.pack and miss_runner is None:  # not read on this run, but a wrong pack is refused
        from strata.cpu.pack import open_pack

        open_pack(cfg.pack, model, release=cfg.release)
    engine = Engine(
        model,
        tier,
        miss_runner=miss_runner,
        resident=resident,
        car=car,
        adaptive=adaptive,
        trace_path=cfg.dump_router_scores,
        graphs=cfg.cuda_graphs,
        # the card's routing serves the primary and the pool; beside helpers the host routes
        device_routing=device_routing and not helpers,
    )
    if cfg.spec > 0:
        from strata.engine.speculative import SpecKnobs, Speculator, SpecUnsupported

        try:
            engine.spec = Speculator(engine, SpecKnobs(cfg.spec, cfg.spec_min_p))
        except SpecUnsupported as e:
            raise ConfigError(str(e)) from None
    return engine


def open_helper_cards(model: Model, cfg: EngineConfig, wanted: bool) -> list:
    """The helper cards of `--helper-cache` (strata/gpu/helper.py): only beside a GPU tier
    that leaves experts to the CPU pool (else said once and none)."""
    spec = parse_helpers(cfg.helper_cache)
    if not spec:
        return []
    if not wanted:
        say_once("--helper-cache unused: the primary GPU holds every expert, or there is none")
        return []
    a = model.args
    if a.expert_bias or a.ffn_act != "silu":  # helper.py's experts have no biases, plain SwiGLU
        say_once(f"--helper-cache unused: helper cards do not run {a.arch}'s experts yet")
        return []
    from strata.gpu.helper import open_helpers

    return open_helpers(model, spec, cfg.primary_device)


def build_batch_engine(model: Model, cfg: EngineConfig, max_batch: int):
    """A `BatchEngine` (strata/engine/batch.py) of up to `max_batch` sequences as `cfg`
    describes it: the CPU-only tier, every expert in the CPU pool unless `--expert-cache` keeps
    some on the tier. Batching runs on the CPU-only tier for now; a GPU config is refused."""
    from strata.engine.batch import BatchEngine

    a = model.args
    if a.linear_attn:
        raise ConfigError(
            f"batched decode: {a.arch}'s DeltaNet layers keep one recurrent state per engine; "
            "batching them is not supported yet"
        )
    if cfg.device == "gpu" or (
        cfg.device == "auto" and primary_device(cfg.primary_device) is not None
    ):
        raise ConfigError("batched decode is CPU-only for now: use --device host")
    n_ctx = cfg.n_ctx or min(a.n_ctx_train, 4096)
    if n_ctx < 2:
        raise ConfigError(f"--ctx must be >= 2 for batched decode, got {n_ctx}")
    total = a.n_layer * a.n_expert
    cache = cfg.expert_cache or "0"
    slots = total if cache == "all" else 0 if cache == "auto" else min(int(cache), total)
    profile = UsageProfile.load(cfg.profile, a.n_layer, a.n_expert) if cfg.profile else None
    resident = resident_mask(model, slots, profile)
    car = car_knobs(cfg, slots, total)
    # the tier's own one-sequence cache goes unused: the sequences' rows live in the KV pool
    tier = make_tier(model, 1, "host", kv_type=cfg.kv_type)
    miss_runner = pool_runner(model, cfg, resident) if slots < total else None
    return BatchEngine(
        model,
        tier,
        n_ctx=n_ctx,
        max_batch=max_batch,
        miss_runner=miss_runner,
        car=car if car.enabled else None,  # CAR off is CAR not wired
        resident=resident,
    )
