"""`strata pack MODEL -o DIR`: build the expert pack (experts.bin + experts.bin.src.json)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from strata.cli.common import UserError, load
from strata.config import setting


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "pack", help="write the CPU experts in the kernels' layout, for `--pack DIR`"
    )
    p.add_argument("model", help="GGUF file or first shard")
    p.add_argument("-o", "--out", required=True, help="pack directory (created if missing)")
    p.add_argument("--release", default=None, help="release the pack is for (env STRATA_RELEASE)")
    p.add_argument("--model-id", default=None, help="model id to record (default: file stem)")
    p.add_argument("--force", action="store_true", help="write into a non-empty DIR")
    p.set_defaults(fn=cmd_pack)


def cmd_pack(ns: argparse.Namespace) -> int:
    from strata.cpu.pack import SRC_FILE, build_pack
    from strata.progress import reporter

    out = Path(ns.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not ns.force:
        raise UserError(f"{out}: directory is not empty (use --force to overwrite the pack)")
    release = setting("release", ns.release or None)
    model = load(ns.model)
    t0 = time.perf_counter()
    with reporter("pack experts", unit="B") as progress:
        path = build_pack(model, out, release=release, model_id=ns.model_id, progress=progress)
    size = path.stat().st_size
    print(
        f"wrote {path} ({size / 2**20:.1f} MiB) and {out / SRC_FILE} "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    return 0
