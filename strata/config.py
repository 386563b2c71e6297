"""`EngineConfig`: every knob in one place, resolved once.

Precedence: command-line flag > `STRATA_*` environment variable > built-in default (per-release
defaults join when the launcher lands). `resolve` also refuses impossible combinations with a
one-line reason (`ConfigError`) and records every automatic downgrade as a notice the caller
prints once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from strata.routing.car import DEFAULT_THRESHOLD

CAR_OFF_NOTICE = "cache-aware routing is OFF for this run"
HOST_DENSE = ("auto", "float", "quant")  # --host-dense (strata.gpu.host.DENSE_MODES)
KV_TYPES = ("f16", "int8")  # --kv-type (strata.gpu.host.KV_TYPES: the tiers' own check)


class ConfigError(ValueError):
    """An impossible or refused setting; the message is one line."""


@dataclass
class EngineConfig:
    model: str | None = None
    n_ctx: int | None = None
    vram_budget_mib: int = 10240
    vram_budget_widen: bool = False  # allow budgets outside 1281..10240 MiB
    device: str = "auto"  # auto (GPU if there is one) | gpu | host
    expert_cache: str | None = None  # "all" | "auto" | a slot count; None = auto on a GPU, else all
    profile: str | None = None  # usage profile that ranks experts for the cache
    adapt_swaps: int = 96
    car_threshold: float = DEFAULT_THRESHOLD
    car_warmup: int = 0
    car_budget: int = 0
    car_free_ratio: float = 1.0
    car_dampen: int = 0
    dump_router_scores: str | None = None
    threads: int = 0  # CPU pool threads (0 = all cores)
    pack: str | None = None  # expert pack directory (`strata pack`); None = the GGUF's bytes
    release: str | None = None  # release the pack must have been built for (None: not checked)
    resident_experts: bool = False  # copy the CPU's experts into RAM instead of reading the mmap
    cuda_graphs: bool = True  # decode steps replayed from CUDA graphs on a GPU tier
    kv_type: str = "f16"  # KV cache: f16, or int8 with a float32 scale per row (token, KV head)
    # the host tier's dense matrices: "quant" (the CPU pool's kernels on the weights' own bytes),
    # "float" (dequantized, the reference) or "auto" (quant once float32 copies pass 1 GiB)
    host_dense: str = "quant"
    # a prompt's missed experts: uploaded to staging slots on the card ("auto": 64 slots; a
    # count; "off": the CPU pool computes them)
    prefill_offload: str = "auto"
    model_id: str | None = None  # the id the server answers to (default: the file's stem)
    # which fields the user set explicitly (flag or environment), for refusals vs downgrades
    explicit: set[str] = field(default_factory=set, repr=False)
    notices: list[str] = field(default_factory=list, repr=False)


# field -> (environment variable, parser)
ENV = {
    "model": ("STRATA_MODEL", str),
    "n_ctx": ("STRATA_CTX", int),
    "vram_budget_mib": ("STRATA_VRAM_BUDGET_MIB", int),
    "vram_budget_widen": ("STRATA_VRAM_BUDGET_WIDEN", lambda v: v.lower() in ("1", "true", "yes")),
    "device": ("STRATA_DEVICE", str),
    "expert_cache": ("STRATA_EXPERT_CACHE", str),
    "profile": ("STRATA_PROFILE", str),
    "adapt_swaps": ("STRATA_ADAPT_SWAPS", int),
    "car_threshold": ("STRATA_CAR_THRESHOLD", float),
    "car_warmup": ("STRATA_CAR_WARMUP", int),
    "car_budget": ("STRATA_CAR_BUDGET", int),
    "car_free_ratio": ("STRATA_CAR_FREE_RATIO", float),
    "car_dampen": ("STRATA_CAR_DAMPEN", int),
    "dump_router_scores": ("STRATA_DUMP_ROUTER_SCORES", str),
    "threads": ("STRATA_THREADS", int),
    "pack": ("STRATA_PACK", str),
    "release": ("STRATA_RELEASE", str),
    "resident_experts": (
        "STRATA_RESIDENT_EXPERTS",
        lambda v: v.lower() in ("1", "true", "yes", "on"),
    ),
    "cuda_graphs": ("STRATA_CUDA_GRAPHS", lambda v: v.lower() not in ("0", "false", "no")),
    "kv_type": ("STRATA_KV_TYPE", str),
    "host_dense": ("STRATA_HOST_DENSE", str),
    "prefill_offload": ("STRATA_PREFILL_OFFLOAD", str),
    "model_id": ("STRATA_MODEL_ID", str),
}


def resolve(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> EngineConfig:
    """Build the config from flags (None = not given) over environment over defaults."""
    env = os.environ if env is None else env
    cfg = EngineConfig()
    names = {f.name for f in fields(EngineConfig)} - {"explicit", "notices"}
    for name in names:
        value = flags.get(name)
        if value is None and name in ENV:
            var, parse = ENV[name]
            raw = env.get(var)
            if raw not in (None, ""):
                try:
                    value = parse(raw)
                except ValueError:
                    kind = getattr(parse, "__name__", "value")
                    raise ConfigError(f"{var}={raw!r} is not a valid {kind}") from None
        if value is not None:
            setattr(cfg, name, value)
            cfg.explicit.add(name)
    _check(cfg)
    return cfg


def _check(cfg: EngineConfig) -> None:
    if cfg.car_dampen:
        raise ConfigError("--car-dampen 1 is not supported (refused rather than ignored)")
    if not 0 < cfg.car_threshold:
        raise ConfigError(f"--car-threshold must be > 0 (1.0 = off), got {cfg.car_threshold}")
    if cfg.car_warmup < 0 or cfg.car_budget < 0 or cfg.adapt_swaps < 0:
        raise ConfigError("--car-warmup, --car-budget and --adapt-swaps must be >= 0")
    if cfg.car_free_ratio <= 0:
        raise ConfigError(f"--car-free-ratio must be > 0, got {cfg.car_free_ratio}")
    if cfg.host_dense not in HOST_DENSE:
        raise ConfigError(f"--host-dense must be {' or '.join(HOST_DENSE)}, got {cfg.host_dense!r}")
    if cfg.kv_type not in KV_TYPES:
        raise ConfigError(f"--kv-type must be {' or '.join(KV_TYPES)}, got {cfg.kv_type!r}")
    if cfg.prefill_offload not in ("auto", "off"):
        try:
            n = int(cfg.prefill_offload)
        except ValueError:
            n = -1
        if n < 0:
            raise ConfigError(
                "--prefill-offload must be 'auto', 'off' or a slot count >= 0, "
                f"got {cfg.prefill_offload!r}"
            )
    if cfg.device not in ("auto", "gpu", "host"):
        raise ConfigError(f"--device must be auto, gpu or host, got {cfg.device!r}")
    if cfg.expert_cache not in (None, "all", "auto"):
        try:
            n = int(cfg.expert_cache)
        except ValueError:
            raise ConfigError(
                f"--expert-cache must be 'all', 'auto' or a slot count, got {cfg.expert_cache!r}"
            ) from None
        if n < 0:
            raise ConfigError(f"--expert-cache must be >= 0, got {n}")
    if not 1281 <= cfg.vram_budget_mib <= 10240 and not cfg.vram_budget_widen:
        raise ConfigError(
            f"--vram-budget-mib {cfg.vram_budget_mib} is outside 1281..10240 "
            "(add --vram-budget-widen to allow it)"
        )


def car_unwired(cfg: EngineConfig, reason: str) -> None:
    """CAR cannot act on this path: refuse if asked for explicitly, else downgrade (a notice)."""
    if "car_threshold" in cfg.explicit and cfg.car_threshold < 1.0:
        raise ConfigError(f"--car-threshold {cfg.car_threshold} cannot apply: {reason}")
    if cfg.car_threshold < 1.0:
        cfg.notices.append(f"{CAR_OFF_NOTICE} ({reason})")
    cfg.car_threshold = 1.0
