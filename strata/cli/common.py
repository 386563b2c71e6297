"""What every `strata` subcommand shares: the user error, model loading, the engine flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from strata.config import ENV, EngineConfig, resolve, setting

DEFAULT_MODEL = Path(__file__).parent.parent / "data" / "default.gguf"
EXIT_USAGE = 2


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def model_path(arg: str | None) -> Path:
    """The model to open: the flag, else STRATA_MODEL, else the embedded model."""
    p = arg or setting("model") or str(DEFAULT_MODEL)
    if not Path(p).exists():
        raise UserError(f"{p}: no such file")
    return Path(p)


def load(arg: str | None):
    from strata.gpu.device import say_once
    from strata.model.loader import load_model

    path = model_path(arg)
    if path.resolve() == DEFAULT_MODEL.resolve():
        say_once(
            "the embedded model (strata-tiny-moe) was trained on Python source only: it "
            "completes code, not questions (--model FILE.gguf for another)"
        )
    return load_model(path)


def one_line(e: BaseException) -> str:
    """An error as the one line a user sees: whatever the message, never a traceback."""
    return f"strata: error: {' '.join(str(e).split()) or type(e).__name__}"


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-m",
        "--model",
        help="GGUF file or first shard (default: the embedded model; env STRATA_MODEL)",
    )


def add_engine(p: argparse.ArgumentParser) -> None:
    """Engine settings; each also reads its STRATA_* variable (a flag wins). docs/CONFIG.md."""
    g = p.add_argument_group("engine (flags beat STRATA_* environment variables)")
    g.add_argument("--vram-budget-mib", type=int, default=None, help="VRAM budget (10240)")
    g.add_argument(
        "--vram-budget-widen",
        action="store_const",
        const=True,
        default=None,
        help="allow a budget outside 1281..10240 MiB",
    )
    g.add_argument(
        "--device",
        default=None,
        choices=["auto", "gpu", "host"],
        help="device tier: auto (GPU if there is one, default), gpu, host",
    )
    g.add_argument(
        "--primary-device",
        type=int,
        default=None,
        metavar="N",
        help="index of the GPU to run on (default 0)",
    )
    g.add_argument(
        "--expert-cache",
        default=None,
        help="resident experts: all (default), auto (what the budget leaves) or N",
    )
    g.add_argument(
        "--helper-cache",
        default=None,
        metavar="DEV=auto|N[,DEV=...]",
        help="expert caches on GPUs other than the primary: N slots, or auto (the card's free "
        "memory less a reserve); e.g. 1=auto or 1=3400,2=auto (docs/SECOND_GPU.md)",
    )
    g.add_argument("--profile", default=None, help="usage profile ranking experts for the cache")
    g.add_argument(
        "--adapt-swaps",
        type=int,
        default=None,
        help="most cache swaps per request (96; 0 = static cache)",
    )
    g.add_argument(
        "--car-threshold",
        type=float,
        default=None,
        help="cache-aware routing ratio threshold (0.35; 1.0 = off)",
    )
    g.add_argument(
        "--car-mode",
        default=None,
        choices=("slack", "ratio"),
        help="slack: substitute only misses the CPU pool cannot hide in the card's window "
        "(default); ratio: the seeds' rule, every miss the threshold allows",
    )
    g.add_argument(
        "--car-max-weight",
        type=float,
        default=None,
        help="slack mode: never substitute a pick of larger router weight (0.1)",
    )
    g.add_argument("--car-warmup", type=int, default=None, help="decode steps before CAR engages")
    g.add_argument(
        "--car-budget",
        type=int,
        default=None,
        help="most substitutions per token and layer (0 = no limit)",
    )
    g.add_argument(
        "--car-free-ratio",
        type=float,
        default=None,
        help="ratio at or above which a substitution is free of the budget",
    )
    g.add_argument(
        "--dump-router-scores",
        default=None,
        metavar="PATH",
        help="write every decode step's router scores to PATH (for `strata car-estimate`)",
    )
    g.add_argument("--threads", type=int, default=None, help="CPU pool threads (0 = all cores)")
    g.add_argument("--pack", default=None, help="expert pack directory (`strata pack`)")
    g.add_argument("--release", default=None, help="release the pack must have been built for")
    g.add_argument(
        "--resident-experts",
        action="store_const",
        const=True,
        default=None,
        help="copy the CPU pool's experts into RAM (default: read them from the mmap)",
    )
    g.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay decode steps from CUDA graphs on a GPU tier (default on)",
    )
    g.add_argument(
        "--kv-type",
        default=None,
        choices=["f16", "int8"],
        help="KV cache: f16 (default) or int8 with a scale per row (about half the memory)",
    )
    g.add_argument(
        "--prefill-offload",
        default=None,
        metavar="auto|off|N",
        help="a prompt's missed experts run on the card from N staging slots (auto: 64) "
        "instead of in the CPU pool (default auto)",
    )
    g.add_argument(
        "--spec",
        type=int,
        default=None,
        metavar="N",
        help="greedy decoding drafts up to N tokens a step with the model's NextN (MTP) block "
        "and verifies them in one forward (default 0 = off)",
    )
    g.add_argument(
        "--spec-min-p",
        type=float,
        default=None,
        metavar="P",
        help="stop drafting where a draft's probability is below P (default 0)",
    )


def engine_config(ns: argparse.Namespace, env=None) -> EngineConfig:
    """The engine config from parsed flags (`--ctx` is n_ctx) over the environment."""
    flags = {name: getattr(ns, name, None) for name in ENV}
    flags["n_ctx"] = getattr(ns, "ctx", None)
    return resolve(flags, env)


def build_engine(model, cfg: EngineConfig):
    from strata.build import build_engine as build

    engine = build(model, cfg)
    for note in cfg.notices:
        print(f"strata: {note}", file=sys.stderr)
    return engine
