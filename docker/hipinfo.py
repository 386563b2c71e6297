#!/usr/bin/env python3
"""AMD GPUs from the KFD topology (no ROCm Python bindings needed).

    hipinfo.py --arch | --vram | --render-node | --reserve-mib | --list | --json | --shell
               [--device N]

GPUs are the KFD nodes with SIMDs, in node order (the order HIP numbers them). `--device` (else
$STRATA_PRIMARY_DEVICE, else 0) picks one. `--root` (else $STRATA_SYSFS_ROOT) prefixes every
/sys path, for fixture trees. Exit 1 with one line when there is no AMD GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

TOPOLOGY = "sys/class/kfd/kfd/topology/nodes"
FRAME_BUFFER_HEAPS = (1, 2)  # HSA_HEAPTYPE_FRAME_BUFFER_PUBLIC / _PRIVATE: the card's VRAM
# VRAM the HIP runtime itself takes (context, code objects, scratch) beside the engine's budget;
# an allowance, not a measurement: override with STRATA_VRAM_RUNTIME_RESERVE_MIB
RUNTIME_RESERVE_MIB = 512
MiB = 1 << 20


def read_props(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def gfx_name(version: int) -> str:
    """gfx_target_version 110001 -> gfx1101, 100300 -> gfx1030, 90010 -> gfx90a."""
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


def gpus(root: Path) -> list[dict]:
    base = root / TOPOLOGY
    if not base.is_dir():
        return []
    found = []
    for node in sorted(base.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 1 << 30):
        props_file = node / "properties"
        if not props_file.is_file():
            continue
        props = read_props(props_file)
        if props.get("simd_count", 0) == 0 or props.get("gfx_target_version", 0) == 0:
            continue  # a CPU node
        vram = 0
        for bank in sorted((node / "mem_banks").glob("*/properties")):
            b = read_props(bank)
            if b.get("heap_type") in FRAME_BUFFER_HEAPS:
                vram += b.get("size_in_bytes", 0)
        gpu_id = node / "gpu_id"
        minor = props.get("drm_render_minor")
        if (
            root == Path("/")
            and minor is not None
            and not Path(f"/dev/dri/renderD{minor}").exists()
        ):
            continue  # sysfs shows every card; a container sees only those passed to it
        found.append(
            {
                "index": len(found),
                "node": int(node.name),
                "arch": gfx_name(props["gfx_target_version"]),
                "vram_mib": vram // MiB,
                "render_node": f"/dev/dri/renderD{minor}" if minor is not None else None,
                "gpu_id": int(gpu_id.read_text().strip()) if gpu_id.is_file() else None,
            }
        )
    return found


def vram_used_bytes(root: Path, gpu: dict) -> int | None:
    """Device-wide VRAM in use (amdgpu sysfs), or None where the file is absent."""
    if not gpu["render_node"]:
        return None
    name = Path(gpu["render_node"]).name
    f = root / "sys/class/drm" / name / "device/mem_info_vram_used"
    return int(f.read_text().strip()) if f.is_file() else None


def reserve_mib(root: Path, gpu: dict, env: dict) -> int:
    """VRAM a budget must leave free: what others hold now plus the runtime's allowance."""
    allowance = int(env.get("STRATA_VRAM_RUNTIME_RESERVE_MIB") or RUNTIME_RESERVE_MIB)
    used = vram_used_bytes(root, gpu) or 0
    return used // MiB + allowance


def pick(found: list[dict], device: int | None, env: dict) -> dict:
    n = device if device is not None else int(env.get("STRATA_PRIMARY_DEVICE") or 0)
    if not 0 <= n < len(found):
        raise SystemExit(f"hipinfo: device {n} does not exist ({len(found)} AMD GPU(s))")
    return found[n]


def main(argv: list[str] | None = None, env: dict | None = None) -> int:
    env = dict(os.environ) if env is None else env
    ap = argparse.ArgumentParser(prog="hipinfo.py", description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    flags = ("--arch", "--vram", "--render-node", "--reserve-mib", "--list", "--json", "--shell")
    for flag in flags:
        what.add_argument(flag, action="store_true")
    ap.add_argument("--device", type=int, default=None, help="GPU index (STRATA_PRIMARY_DEVICE)")
    ap.add_argument("--root", default=None, help="sysfs root prefix (STRATA_SYSFS_ROOT; /)")
    ns = ap.parse_args(argv)
    root = Path(ns.root or env.get("STRATA_SYSFS_ROOT") or "/")
    found = gpus(root)
    if not found:
        print(f"hipinfo: no AMD GPU in the KFD topology ({root / TOPOLOGY})", file=sys.stderr)
        return 1
    if ns.list:
        for g in found:
            print(f"{g['index']} {g['arch']} {g['vram_mib']} MiB {g['render_node']}")
        return 0
    if ns.json:
        print(json.dumps(found))
        return 0
    g = pick(found, ns.device, env)
    if ns.shell:  # one call for shell scripts: ARCH= VRAM= RESERVE= RENDER=
        print(f"ARCH={g['arch']} VRAM={g['vram_mib']} RESERVE={reserve_mib(root, g, env)} ", end="")
        print(f"RENDER={g['render_node'] or ''}")
    elif ns.arch:
        print(g["arch"])
    elif ns.vram:
        print(g["vram_mib"])
    elif ns.render_node:
        print(g["render_node"])
    else:
        print(reserve_mib(root, g, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
