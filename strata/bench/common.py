"""What every benchmark result carries: machine, commit, date; synthetic models on demand."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

DEFAULT_CACHE = Path.home() / ".cache" / "strata"  # `--cache-dir`: synthetic models live here
EMBEDDED_MODEL = Path(__file__).resolve().parents[1] / "data" / "default.gguf"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            info["gpu"] = out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return info


def commit() -> str:
    """`git rev-parse --short HEAD` (+ "-dirty"), or "?" without git; where the tree's .git is
    absent or stale (a copy on another machine) pass `--commit` instead."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).parent,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).parent,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def stamp(commit_id: str | None = None) -> dict[str, Any]:
    """Machine, commit (`commit_id`, else the tree's) and date of a result."""
    return {
        "machine": machine(),
        "commit": commit_id or commit(),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def synthetic_model(
    shape: str,
    quant: str,
    skew: float = 0.0,
    seed: int = 0,
    layers: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    routing_entropy: float | None = None,
) -> Path:
    """A synthetic GGUF cached under `cache_dir` (default ~/.cache/strata; written on first
    use). `routing_entropy`: routers solved for that usage entropy (then `skew` is unused)."""
    from strata.engine.synth_routing import write_routed
    from strata.model.synth import SynthSpec, make_args
    from strata.quant import fmt

    routing = f"H{routing_entropy:g}" if routing_entropy is not None else f"skew{skew:g}"
    name = f"{shape}-{quant.upper()}-{routing}-seed{seed}" + (f"-L{layers}" if layers else "")
    path = Path(cache_dir or DEFAULT_CACHE) / "synth" / f"{name}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        spec = SynthSpec(
            make_args(shape, n_layer=layers),
            expert_quant=fmt(quant).qtype,
            skew=0.0 if routing_entropy is not None else skew,
            seed=seed,
            routing_entropy=routing_entropy,
        )
        write_routed(path, spec)
    return path


def write_json(path: str | os.PathLike, doc: dict[str, Any]) -> None:
    tmp = Path(str(path) + ".partial")
    tmp.write_text(json.dumps(doc, indent=2, default=float))
    os.replace(tmp, path)
