"""`strata resolve`: what run.sh and docker/entrypoint.sh ask (`--print release|quant|repo|files|
pack-dir|model-id|license|env|shell`); the logic is strata.releases.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Mapping

from strata.releases import (
    Resolution,
    ResolveError,
    disk_gate,
    engine_env,
    fetch,
    resolve,
    table,
)

PRINTS = ("release", "quant", "repo", "files", "pack-dir", "model-id", "license", "env", "shell")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "resolve", help="release + quant -> repo, files, pack dir, model id, engine config"
    )
    p.add_argument(
        "--release",
        default=None,
        help="qwen | coder | gpt-oss-20b | gpt-oss-120b | swift (env STRATA_RELEASE)",
    )
    p.add_argument("--quant", default=None, help="e.g. IQ3_S (env STRATA_QUANT)")
    p.add_argument(
        "--packs-dir", default=None, metavar="DIR", help="pack root (env STRATA_PACKS_DIR; packs)"
    )
    p.add_argument("--print", dest="what", choices=PRINTS, default=None, help="one value")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if files are missing; no writes")
    mode.add_argument("--fetch", action="store_true", help="download missing files (space-gated)")
    p.add_argument("--gate", action="store_true", help="refuse when the disk is too small")
    g = p.add_argument_group("engine config (for --print env|shell; flags beat STRATA_*)")
    g.add_argument("--max-context", type=int, default=None, dest="n_ctx", metavar="N")
    g.add_argument("--vram-budget-mib", type=int, default=None, metavar="MIB")
    g.add_argument("--device", default=None, choices=["auto", "gpu", "host"])
    g.add_argument("--expert-cache", default=None, metavar="all|auto|N")
    g.add_argument("--adapt-swaps", type=int, default=None, metavar="N")
    p.set_defaults(fn=cmd_resolve)


def cmd_resolve(ns: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    res = resolve(ns.release, ns.quant, env, ns.packs_dir)
    if ns.check:
        try:
            res.require_present()
        except ResolveError as e:
            print(f"strata: {e}", file=sys.stderr)
            return 1
    if ns.gate:
        disk_gate(res)
    if ns.fetch:
        fetch(res)
    if ns.what is None:
        if not ns.check and not ns.fetch:
            _summary(res)
        return 0
    if ns.what in ("env", "shell"):
        flags = {k: getattr(ns, k) for k in ("n_ctx", "vram_budget_mib", "device")}
        flags |= {k: getattr(ns, k) for k in ("expert_cache", "adapt_swaps")}
        lines, notes = engine_env(res, flags, env)
        for n in notes:
            print(f"strata: {n}", file=sys.stderr)
        text = "\n".join(f"{k}={v}" for k, v in lines.items())
        print(_shell(res, text) if ns.what == "shell" else text)
        return 0
    print(_value(res, ns.what))
    return 0


def _value(res: Resolution, what: str) -> str:
    if what == "files":
        return "\n".join(str(p) for p in res.require_present())
    return {
        "release": res.release,
        "quant": res.quant,
        "repo": res.repo or "",
        "pack-dir": str(res.pack_dir),
        "model-id": res.model_id,
        "license": res.license,
    }[what]


def _shell(res: Resolution, engine: str) -> str:
    vals = {
        "RELEASE": res.release,
        "QUANT": res.quant,
        "REPO": res.repo or "",
        "MODEL_ID": res.model_id,
        "PACK_DIR": str(res.pack_dir),
        "LICENSE": res.license,
        "HUB_CACHE": str(res.hub_cache),
        "MODEL_PATH": str(res.files[0]) if res.files else "",
        "GUARD_VERSION": str(table()["vram_guard_version"]),
        "ENGINE_ENV": engine,  # the STRATA_* lines, one per line
    }
    return "\n".join(f"{k}={shlex.quote(v)}" for k, v in vals.items())


def _summary(res: Resolution) -> None:
    print(f"release   {res.release} ({res.info['title']}; chosen by {res.why})")
    print(f"quant     {res.quant}")
    print(f"repo      {res.repo or '(embedded, no download)'}")
    print(f"license   {res.license}")
    print(f"model id  {res.model_id}")
    print(f"pack dir  {res.pack_dir}{'' if res.pack_dir.is_dir() else ' (not built)'}")
    if res.present:
        print("files     " + "\n          ".join(str(p) for p in res.files))
    else:
        print(f"files     not cached; fetch: {res.fetch_command()}")
