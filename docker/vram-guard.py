#!/usr/bin/env python3
"""Sample device memory against the VRAM budget; exit 3 with the numbers on a breach.

    vram-guard.py --budget-mib 10240 [--pid PID] [--vendor amd|nvidia] [--device N]
                  [--interval 1.0] [--samples N] [--slack-mib 0]

With --pid the engine process's own share is measured: AMD through the amdgpu fdinfo of its
DRM files (/proc/PID/fdinfo, drm-memory-vram per client), else
/sys/class/kfd/kfd/proc/PID/vram_<gpu_id>; NVIDIA through NVML's per-process usage. Where
the process cannot be attributed (NVML inside a PID namespace sees host PIDs), the whole
device's use is held to the budget instead, said once. The guard exits 0 when PID ends.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

MiB = 1 << 20
BREACH = 3
UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _hipinfo():
    spec = importlib.util.spec_from_file_location("hipinfo", Path(__file__).with_name("hipinfo.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fdinfo_vram(root: Path, pid: int) -> int | None:
    """VRAM of PID's amdgpu DRM clients from fdinfo (each client counted once), or None."""
    seen: dict[str, int] = {}
    for f in sorted((root / "proc" / str(pid) / "fdinfo").glob("*")):
        try:
            fields = dict(line.split(":", 1) for line in f.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if fields.get("drm-driver") != "amdgpu":
            continue
        raw = fields.get("drm-memory-vram") or fields.get("drm-resident-vram")
        if raw is None:
            continue
        num, _, unit = raw.partition(" ")
        client = fields.get("drm-pdev", "") + "/" + fields.get("drm-client-id", f.name)
        seen[client] = int(num) * UNITS.get(unit.strip(), 1)
    return sum(seen.values()) if seen else None


class AmdSource:
    def __init__(self, root: Path, device: int | None, env: dict):
        self.hip = _hipinfo()
        self.root = root
        found = self.hip.gpus(root)
        if not found:
            raise SystemExit(f"vram-guard: no AMD GPU under {root}")
        self.gpu = self.hip.pick(found, device, env)
        self.name = f"GPU {self.gpu['index']} ({self.gpu['arch']})"

    def device_used(self) -> int | None:
        return self.hip.vram_used_bytes(self.root, self.gpu)

    def process_used(self, pid: int) -> int | None:
        # fdinfo first: /proc is PID-namespaced, KFD's sysfs names processes by host PID
        mine = fdinfo_vram(self.root, pid)
        if mine is not None:
            return mine
        kfd = self.root / "sys/class/kfd/kfd/proc" / str(pid) / f"vram_{self.gpu['gpu_id']}"
        return int(kfd.read_text().strip()) if kfd.is_file() else None

    def alive(self, pid: int) -> bool:
        if self.root != Path("/"):  # a fixture tree: the process is alive while it is listed
            return (self.root / "proc" / str(pid)).is_dir()
        return Path(f"/proc/{pid}").is_dir()


class NvidiaSource:
    def __init__(self, device: int | None, env: dict, nvml=None):
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py
        self.nvml = nvml
        nvml.nvmlInit()
        n = device if device is not None else int(env.get("STRATA_PRIMARY_DEVICE") or 0)
        self.handle = nvml.nvmlDeviceGetHandleByIndex(n)
        self.name = f"GPU {n} (NVIDIA)"

    def device_used(self) -> int | None:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def process_used(self, pid: int) -> int | None:
        for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if p.pid == pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return None

    def alive(self, pid: int) -> bool:
        return Path(f"/proc/{pid}").is_dir()


def check(source, budget_mib: int, slack_mib: int, pid: int | None, said: set) -> str | None:
    """One sample: None when within budget, else the breach line."""
    used = source.device_used()
    mine = source.process_used(pid) if pid is not None else None
    if pid is not None and mine is None and "unattributed" not in said:
        said.add("unattributed")
        print(
            f"vram-guard: pid {pid} has no per-process VRAM record on {source.name}; "
            "holding the whole device's use to the budget",
            file=sys.stderr,
        )
    held = mine if mine is not None else used
    if held is None:
        return None
    limit = (budget_mib + slack_mib) * MiB
    if held <= limit:
        return None
    who = f"pid {pid}" if mine is not None else "the device"
    dev = f"; device in use {used // MiB} MiB" if used is not None else ""
    return (
        f"vram-guard: breach: {who} holds {held // MiB} MiB on {source.name}, over the budget "
        f"of {budget_mib} MiB (+{slack_mib} slack){dev}"
    )


def run(source, ns) -> int:
    said: set = set()
    n = 0
    while True:
        line = check(source, ns.budget_mib, ns.slack_mib, ns.pid, said)
        if line:
            print(line, file=sys.stderr, flush=True)
            return BREACH
        n += 1
        if ns.samples and n >= ns.samples:
            return 0
        if ns.pid is not None and not source.alive(ns.pid):
            return 0
        time.sleep(ns.interval)


def main(argv: list[str] | None = None, env: dict | None = None, nvml=None) -> int:
    env = dict(os.environ) if env is None else env
    ap = argparse.ArgumentParser(prog="vram-guard.py", description=__doc__.splitlines()[0])
    default_budget = int(env.get("STRATA_VRAM_BUDGET_MIB") or 10240)
    ap.add_argument("--budget-mib", type=int, default=default_budget)
    ap.add_argument("--slack-mib", type=int, default=int(env.get("STRATA_VRAM_SLACK_MIB") or 0))
    ap.add_argument("--pid", type=int, default=None, help="the engine process to attribute")
    ap.add_argument("--vendor", choices=["amd", "nvidia"], default=None)
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--samples", type=int, default=0, help="stop after N samples (0 = run on)")
    ap.add_argument("--root", default=None, help="sysfs/procfs root prefix (STRATA_SYSFS_ROOT)")
    ns = ap.parse_args(argv)
    vendor = ns.vendor or ("nvidia" if env.get("STRATA_VENDOR") == "cuda" else "amd")
    if vendor == "amd":
        source = AmdSource(Path(ns.root or env.get("STRATA_SYSFS_ROOT") or "/"), ns.device, env)
    else:
        source = NvidiaSource(ns.device, env, nvml)
    return run(source, ns)


if __name__ == "__main__":
    sys.exit(main())
