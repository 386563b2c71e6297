"""Build an `Engine` from an `EngineConfig`: tier, expert cache placement, CAR, traces."""

from __future__ import annotations

import numpy as np

from strata.config import ConfigError, EngineConfig, car_unwired
from strata.engine.forward import Engine
from strata.engine.pool_runner import PoolMissRunner
from strata.gpu.select import make_tier
from strata.model.loader import Model
from strata.routing.car import CarKnobs
from strata.routing.profile import AdaptiveCache, UsageProfile, place

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


PREFILL_STAGE_AUTO = 64  # staging slots of --prefill-offload auto


def prefill_stage_slots(cfg: EngineConfig, n_expert: int, cpu_pool: bool) -> int:
    """Staging slots for a prompt's missed experts on the card (0: the CPU pool computes them):
    only where some experts live in the pool; never more than a layer's experts."""
    if not cpu_pool or cfg.prefill_offload == "off":
        return 0
    n = PREFILL_STAGE_AUTO if cfg.prefill_offload == "auto" else int(cfg.prefill_offload)
    return min(n, n_expert)


def _gpu_available(device: str) -> bool:
    from strata.gpu.device import primary_device

    return device in ("auto", "gpu") and primary_device() is not None


def build_engine(model: Model, cfg: EngineConfig) -> Engine:
    a = model.args
    n_ctx = cfg.n_ctx or min(a.n_ctx_train, 4096)
    if n_ctx < 1:
        raise ConfigError(f"--ctx must be >= 1, got {n_ctx}")
    total = a.n_layer * a.n_expert
    on_gpu = cfg.device != "host" and _gpu_available(cfg.device)
    # without a GPU every expert runs in the CPU pool by default: its quantized kernels beat the
    # host tier's float emulation of the device (embedded model, 2-core VM: decode 71.4 -> 116.0
    # tok/s, a 128-token prompt 753 -> 1106 tok/s: bench/results/host-default-pool-2core-*.md)
    cache = cfg.expert_cache or ("auto" if on_gpu else "0")
    if cache == "all":
        slots = total
    elif cache == "auto":
        slots = auto_slots(model, cfg.vram_budget_mib, n_ctx, cfg.kv_type)  # host's estimate
    else:
        slots = min(int(cache), total)
    tier = make_tier(
        model,
        n_ctx,
        vram_budget_mib=cfg.vram_budget_mib,
        # auto: what the tier's own budget leaves after weights, KV, workspace and reserves;
        # a device tier keeps room for one token
        expert_slots="auto" if cache == "auto" else max(slots, a.n_expert_used),
        device=cfg.device,
        widen_budget=cfg.vram_budget_widen,
        kv_type=cfg.kv_type,
        prefill_stage=prefill_stage_slots(cfg, a.n_expert, on_gpu and slots < total),
        host_dense=cfg.host_dense,
    )
    if cache == "auto" and hasattr(tier, "n_slots"):
        slots = min(int(tier.n_slots), total)
    profile = UsageProfile.load(cfg.profile, a.n_layer, a.n_expert) if cfg.profile else None
    resident = resident_mask(model, slots, profile)
    if slots >= total:
        car_unwired(cfg, "every expert is resident, no expert runs in the CPU pool")
    elif slots == 0:
        car_unwired(cfg, "no expert is resident, CAR has nothing to substitute")
    car = CarKnobs(cfg.car_threshold, cfg.car_warmup, cfg.car_budget, cfg.car_free_ratio)
    adaptive = None
    if slots < total and cfg.adapt_swaps > 0 and slots > 0:
        adaptive = AdaptiveCache(resident, max_swaps=cfg.adapt_swaps)
    if hasattr(tier, "load_resident"):  # the GPU tier uploads the placed experts now
        resident[:] = tier.load_resident(resident)
    # the experts the tier does not hold run in the CPU pool
    miss_runner = (
        PoolMissRunner(
            model,
            cfg.threads,
            pack=cfg.pack,
            resident_experts=cfg.resident_experts,
            skip=resident,
            release=cfg.release,
        )
        if slots < total
        else None
    )
    if cfg.pack and miss_runner is None:  # not read on this run, but a wrong pack is refused
        from strata.cpu.pack import open_pack

        open_pack(cfg.pack, model, release=cfg.release)
    return Engine(
        model,
        tier,
        miss_runner=miss_runner,
        resident=resident,
        car=car,
        adaptive=adaptive,
        trace_path=cfg.dump_router_scores,
        graphs=cfg.cuda_graphs,
    )
