"""`strata pack MODEL -o DIR`: build the expert pack (experts.bin + experts.bin.src.json);
`--verify` checks an existing one against the model, every byte."""

from __future__ import annotations

import argparse
import sys
import time
import warnings
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
    p.add_argument(
        "--verify",
        action="store_true",
        help="check the pack in DIR against MODEL (every block and expert byte); write nothing",
    )
    p.set_defaults(fn=cmd_pack)


def cmd_pack(ns: argparse.Namespace) -> int:
    from strata.cpu.pack import SRC_FILE, build_pack, remove_temporaries, temporaries

    out = Path(ns.out)
    if ns.verify:
        return _verify(ns, out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    stale = set(temporaries(out))  # a killed build's leftovers: removed, never "content"
    if out.is_dir() and set(out.iterdir()) - stale and not ns.force:
        raise UserError(f"{out}: directory is not empty (use --force to overwrite the pack)")
    from strata.progress import reporter

    release = setting("release", ns.release or None)
    model = load(ns.model)
    for q in remove_temporaries(out):
        print(f"removed {q} (left by an interrupted build)", file=sys.stderr)
    t0 = time.perf_counter()
    with reporter("pack experts", unit="B") as progress:
        path = build_pack(model, out, release=release, model_id=ns.model_id, progress=progress)
    size = path.stat().st_size
    print(
        f"wrote {path} ({size / 2**20:.1f} MiB) and {out / SRC_FILE} "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    return 0


def _verify(ns: argparse.Namespace, out: Path) -> int:
    """Open the pack as a run would, with every block of experts.bin and every expert byte of
    the model hashed; a PackError is the one-line answer (exit 2)."""
    from strata.cpu.pack import PackError, PackWarning, open_pack

    release = setting("release", ns.release or None)
    model = load(ns.model)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PackWarning)  # nothing to verify against is no pass
        try:
            pack = open_pack(out, model, release=release, verify=True)
        except PackWarning as w:
            raise UserError(str(w)) from None
        except PackError as e:
            raise UserError(str(e)) from None
    print(
        f"{pack.path}: ok, {pack.nbytes / 2**20:.1f} MiB of experts match {model.path.name} "
        f"(checked in {time.perf_counter() - t0:.1f} s)"
    )
    return 0
