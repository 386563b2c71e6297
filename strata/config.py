"""Every user setting in one place, and the only reader of the process environment.

Precedence: command-line flag > `STRATA_*` environment variable > release default (the tuning row
`strata resolve` applies for a release and quant) > built-in default. `resolve` refuses
impossible combinations with a one-line reason (`ConfigError`) and records every automatic
downgrade as a notice the caller prints once. docs/CONFIG.md lists every setting.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from strata.routing.car import DEFAULT_MAX_WEIGHT, DEFAULT_MODE, DEFAULT_THRESHOLD, MODES
from strata.serve.reasoning import EFFORTS

CAR_OFF_NOTICE = "cache-aware routing is OFF for this run"
KV_TYPES = ("f16", "int8")  # --kv-type (the tiers check it again)
DEVICES = ("auto", "gpu", "host")


class ConfigError(ValueError):
    """An impossible or refused setting; the message is one line."""


@dataclass
class EngineConfig:
    model: str | None = None
    n_ctx: int | None = None
    vram_budget_mib: int = 10240
    vram_budget_widen: bool = False  # allow budgets outside 1281..10240 MiB
    device: str = "auto"  # auto (GPU if there is one) | gpu | host
    primary_device: int = 0  # index of the GPU the engine runs on
    expert_cache: str | None = None  # "all" | "auto" | a slot count; None = auto on a GPU, else all
    # expert caches on GPUs other than the primary: "DEV=auto|N[,DEV=...]" (None: none)
    helper_cache: str | None = None
    profile: str | None = None  # usage profile that ranks experts for the cache
    adapt_swaps: int = 96
    car_threshold: float = DEFAULT_THRESHOLD
    car_warmup: int = 0
    car_budget: int = 0
    car_free_ratio: float = 1.0
    car_mode: str = DEFAULT_MODE  # slack | ratio (the seeds' rule)
    car_max_weight: float = DEFAULT_MAX_WEIGHT  # slack mode: heavier picks are never substituted
    dump_router_scores: str | None = None
    threads: int = 0  # CPU pool threads (0 = all cores)
    pack: str | None = None  # expert pack directory (`strata pack`); None = the GGUF's bytes
    release: str | None = None  # release the pack must have been built for (None: not checked)
    resident_experts: bool = False  # copy the CPU's experts into RAM instead of reading the mmap
    cuda_graphs: bool = True  # decode steps replayed from CUDA graphs on a GPU tier
    kv_type: str = "f16"  # KV cache: f16, or int8 with a float32 scale per row (token, KV head)
    # a prompt's missed experts: uploaded to staging slots on the card ("auto": 64 slots; a
    # count; "off": the CPU pool computes them)
    prefill_offload: str = "auto"
    model_id: str | None = None  # the id the server answers to (default: the file's stem)
    spec: int = 0  # most NextN (MTP) drafts a greedy decode step verifies (0 = off)
    spec_min_p: float = 0.0  # stop drafting where a draft's probability is below this
    # which fields the user set explicitly (flag or environment), for refusals vs downgrades
    explicit: set[str] = field(default_factory=set, repr=False)
    notices: list[str] = field(default_factory=list, repr=False)


def _flag(v: str) -> bool:
    return v.strip().lower() in ("1", "true", "yes", "on")


def _not_off(v: str) -> bool:
    return v.strip().lower() not in ("0", "false", "no", "off")


def number(v: str) -> float:
    """A finite float ('nan' and 'inf' parse as floats but are no setting's value)."""
    x = float(v)
    if not math.isfinite(x):
        raise ValueError(v)
    return x


# EngineConfig field -> (environment variable, parser)
ENV: dict[str, tuple[str, Callable[[str], Any]]] = {
    "model": ("STRATA_MODEL", str),
    "n_ctx": ("STRATA_CTX", int),
    "vram_budget_mib": ("STRATA_VRAM_BUDGET_MIB", int),
    "vram_budget_widen": ("STRATA_VRAM_BUDGET_WIDEN", _flag),
    "device": ("STRATA_DEVICE", str),
    "primary_device": ("STRATA_PRIMARY_DEVICE", int),
    "expert_cache": ("STRATA_EXPERT_CACHE", str),
    "helper_cache": ("STRATA_HELPER_CACHE", str),
    "profile": ("STRATA_PROFILE", str),
    "adapt_swaps": ("STRATA_ADAPT_SWAPS", int),
    "car_threshold": ("STRATA_CAR_THRESHOLD", number),
    "car_warmup": ("STRATA_CAR_WARMUP", int),
    "car_budget": ("STRATA_CAR_BUDGET", int),
    "car_free_ratio": ("STRATA_CAR_FREE_RATIO", number),
    "car_mode": ("STRATA_CAR_MODE", str),
    "car_max_weight": ("STRATA_CAR_MAX_WEIGHT", number),
    "dump_router_scores": ("STRATA_DUMP_ROUTER_SCORES", str),
    "threads": ("STRATA_THREADS", int),
    "pack": ("STRATA_PACK", str),
    "release": ("STRATA_RELEASE", str),
    "resident_experts": ("STRATA_RESIDENT_EXPERTS", _flag),
    "cuda_graphs": ("STRATA_CUDA_GRAPHS", _not_off),
    "kv_type": ("STRATA_KV_TYPE", str),
    "prefill_offload": ("STRATA_PREFILL_OFFLOAD", str),
    "model_id": ("STRATA_MODEL_ID", str),
    "spec": ("STRATA_SPEC", int),
    "spec_min_p": ("STRATA_SPEC_MIN_P", number),
}

# ServeConfig field -> environment variable (the server's own settings beyond the engine's)
SERVE_ENV = {"api_key": "STRATA_API_KEY", "reasoning_effort": "STRATA_REASONING_EFFORT"}

# LaunchConfig field -> environment variable (what `strata resolve` reads besides the engine's)
LAUNCH_ENV = {
    "quant": "STRATA_QUANT",
    "hf_repo": "STRATA_HF_REPO",
    "packs_dir": "STRATA_PACKS_DIR",
    "disk_floor_gb": "STRATA_DISK_FLOOR_GB",
}

# huggingface_hub's own variables, honoured where Strata finds or fetches files
HUB_ENV = ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HF_HUB_OFFLINE")

NAMES = tuple(var for var, _ in ENV.values()) + tuple(SERVE_ENV.values())
NAMES += tuple(LAUNCH_ENV.values())


def environ() -> dict[str, str]:
    """The variables Strata reads, from this process's environment (read per call)."""
    return {k: os.environ[k] for k in NAMES + HUB_ENV if k in os.environ}


def _parse(var: str, parse: Callable[[str], Any], raw: str) -> Any:
    try:
        return parse(raw)
    except ValueError:
        kind = getattr(parse, "__name__", "value")
        raise ConfigError(f"{var}={raw!r} is not a valid {kind}") from None


def setting(name: str, flag: Any = None, env: Mapping[str, str] | None = None) -> Any:
    """One EngineConfig field outside a full resolve: the flag, else its variable, else None."""
    if flag is not None:
        return flag
    var, parse = ENV[name]
    raw = (environ() if env is None else env).get(var)
    return None if raw in (None, "") else _parse(var, parse, raw)


def layer(
    name: str,
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Any:
    """One field by precedence: flag > environment (raw text) > release default > None."""
    if flags.get(name) is not None:
        return flags[name]
    env = environ() if env is None else env
    var = ENV[name][0]
    if env.get(var) not in (None, ""):
        return env[var]
    return (defaults or {}).get(name)


def resolve(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    release_defaults: Mapping[str, Any] | None = None,
) -> EngineConfig:
    """Build the config from flags (None = not given) over environment over release defaults
    over built-in defaults."""
    env = environ() if env is None else env
    cfg = EngineConfig()
    for f in fields(EngineConfig):
        if f.name not in ENV:
            continue
        var, parse = ENV[f.name]
        value = flags.get(f.name)
        if value is None:
            raw = env.get(var)
            if raw not in (None, ""):
                value = _parse(var, parse, raw)
        if value is not None:
            cfg.explicit.add(f.name)
        elif release_defaults and release_defaults.get(f.name) is not None:
            value = release_defaults[f.name]
            if isinstance(value, str):
                value = _parse(var, parse, value)
        if value is not None:
            setattr(cfg, f.name, value)
    _check(cfg)
    return cfg


def _check(cfg: EngineConfig) -> None:
    if not 0 < cfg.car_threshold:
        raise ConfigError(f"--car-threshold must be > 0 (1.0 = off), got {cfg.car_threshold}")
    if cfg.car_warmup < 0 or cfg.car_budget < 0 or cfg.adapt_swaps < 0:
        raise ConfigError("--car-warmup, --car-budget and --adapt-swaps must be >= 0")
    if not (math.isfinite(cfg.car_threshold) and math.isfinite(cfg.car_free_ratio)):
        raise ConfigError("--car-threshold and --car-free-ratio must be finite numbers")
    if cfg.car_free_ratio <= 0:
        raise ConfigError(f"--car-free-ratio must be > 0, got {cfg.car_free_ratio}")
    if cfg.car_mode not in MODES:
        raise ConfigError(f"--car-mode must be {' or '.join(MODES)}, got {cfg.car_mode!r}")
    if not 0 < cfg.car_max_weight:
        raise ConfigError(f"--car-max-weight must be > 0, got {cfg.car_max_weight}")
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
    if cfg.spec < 0:
        raise ConfigError(f"--spec must be >= 0 (0 = off), got {cfg.spec}")
    if not 0 <= cfg.spec_min_p <= 1:
        raise ConfigError(f"--spec-min-p must be in [0, 1], got {cfg.spec_min_p}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"--device must be auto, gpu or host, got {cfg.device!r}")
    if cfg.primary_device < 0:
        raise ConfigError(f"--primary-device must be >= 0, got {cfg.primary_device}")
    if cfg.expert_cache not in (None, "all", "auto"):
        try:
            n = int(cfg.expert_cache)
        except ValueError:
            raise ConfigError(
                f"--expert-cache must be 'all', 'auto' or a slot count, got {cfg.expert_cache!r}"
            ) from None
        if n < 0:
            raise ConfigError(f"--expert-cache must be >= 0, got {n}")
    if cfg.helper_cache:
        if any(d == cfg.primary_device for d, _ in parse_helpers(cfg.helper_cache)):
            raise ConfigError(
                f"--helper-cache names device {cfg.primary_device}, the primary device "
                "(--primary-device)"
            )
    if not 1281 <= cfg.vram_budget_mib <= 10240 and not cfg.vram_budget_widen:
        raise ConfigError(
            f"--vram-budget-mib {cfg.vram_budget_mib} is outside 1281..10240 "
            "(add --vram-budget-widen to allow it)"
        )


def parse_helpers(spec: str | None) -> list[tuple[int, int | str]]:
    """`--helper-cache` -> [(device ordinal, "auto" | slots)]: "1=auto,2=3400"; "" or None:
    no helper. Refuses (ConfigError, one line) a malformed entry or a device named twice."""
    out: list[tuple[int, int | str]] = []
    for part in (spec or "").replace(" ", "").split(","):
        if not part:
            continue
        dev, sep, size = part.partition("=")
        try:
            d = int(dev)
            n: int | str = "auto" if size == "auto" else int(size)
        except ValueError:
            d, n = -1, -1
        if not sep or d < 0 or (n != "auto" and int(n) < 1):
            raise ConfigError(
                f"--helper-cache entries are DEVICE=auto or DEVICE=SLOTS (slots >= 1), got {part!r}"
            )
        if any(d == o for o, _ in out):
            raise ConfigError(f"--helper-cache names device {d} twice")
        out.append((d, n))
    return out


def car_unwired(cfg: EngineConfig, reason: str) -> None:
    """CAR cannot act on this path: refuse if asked for explicitly, else downgrade (a notice)."""
    if "car_threshold" in cfg.explicit and cfg.car_threshold < 1.0:
        raise ConfigError(f"--car-threshold {cfg.car_threshold} cannot apply: {reason}")
    if cfg.car_threshold < 1.0:
        cfg.notices.append(f"{CAR_OFF_NOTICE} ({reason})")
    cfg.car_threshold = 1.0


# ---------------------------------------------------------------- the server


@dataclass
class ServeConfig:
    api_key: str | None = None  # require 'Authorization: Bearer KEY'
    reasoning_effort: str | None = None  # deployment default; a request's own overrides it


def resolve_serve(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> ServeConfig:
    env = environ() if env is None else env
    cfg = ServeConfig()
    for name, var in SERVE_ENV.items():
        value = flags.get(name)
        if value is None:
            value = env.get(var) or None
        setattr(cfg, name, value or None)
    if cfg.reasoning_effort not in (None, *EFFORTS):
        raise ConfigError(
            f"{SERVE_ENV['reasoning_effort']}: reasoning effort must be one of "
            f"{', '.join(EFFORTS)}; got {cfg.reasoning_effort!r}"
        )
    return cfg


# ---------------------------------------------------------------- the launcher's resolver


@dataclass
class LaunchConfig:
    """What `strata resolve` reads: the release and quant asked for and where files live."""

    release: str | None = None
    quant: str | None = None
    hf_repo: str | None = None  # a custom repository for the release's quants
    packs_dir: str = "packs"
    disk_floor_gb: float | None = None  # None: the release table's floor
    hub_cache: Path = field(default_factory=Path)
    hub_offline: bool = False
    release_from: str = "--release"  # which of flag / variable gave `release`


def resolve_launch(
    release: str | None = None,
    quant: str | None = None,
    packs_dir: str | None = None,
    env: Mapping[str, str] | None = None,
) -> LaunchConfig:
    env = environ() if env is None else env
    cfg = LaunchConfig(
        release=release or env.get(ENV["release"][0]) or None,
        quant=quant or env.get(LAUNCH_ENV["quant"]) or None,
        hf_repo=env.get(LAUNCH_ENV["hf_repo"]) or None,
        packs_dir=packs_dir or env.get(LAUNCH_ENV["packs_dir"]) or "packs",
        hub_cache=hub_cache(env),
        hub_offline=(env.get("HF_HUB_OFFLINE") or "").strip().upper() in ("1", "ON", "YES", "TRUE"),
        release_from="--release" if release else ENV["release"][0],
    )
    floor = env.get(LAUNCH_ENV["disk_floor_gb"])
    if floor:
        var = LAUNCH_ENV["disk_floor_gb"]
        cfg.disk_floor_gb = _parse(var, number, floor)
        if cfg.disk_floor_gb < 0:
            raise ConfigError(f"{var}={floor!r} must be >= 0 (GB of free disk to keep)")
    return cfg


def hub_cache(env: Mapping[str, str]) -> Path:
    """huggingface_hub's cache folder for this environment."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"
