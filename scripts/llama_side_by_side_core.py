"""The pure half of scripts/llama_side_by_side.py: GGUF expert bytes, device-memory sampling,
llama-bench JSON, the --n-cpu-moe choice, the ratio table and the markdown report.

Stdlib only, so tests load it without a build, a GPU or the strata package.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import statistics
import struct
import subprocess
import threading
from collections.abc import Callable

# decode goals per Strata arm (issue 47's Must-show): the hybrid arms against the best fitting
# --n-cpu-moe, all-cpu against --cpu-moe, all-gpu against llama.cpp with every expert on the card
GOALS = {"car-off": 2.5, "car-on": 2.5, "all-cpu": 2.0, "all-gpu": 1.3}


class Fail(Exception):
    """A one-line reason; the script prints it and exits non-zero."""


# --------------------------------------------------------------------------------------------
# GGUF: per-layer expert bytes (stdlib reader of the header and tensor table)

_SCALAR = {  # GGUF scalar value types -> struct codes
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
EXPS_RE = re.compile(r"^blk\.(\d+)\.ffn_(up|down|gate|gate_up)_(ch|)exps\.")


def read_gguf_layout(path: str | os.PathLike) -> dict:
    """Architecture, layer count and bytes per tensor (from data offsets) of a GGUF file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    pos = 0

    def take(fmt: str):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string() -> str:
        nonlocal pos
        n = take("Q")
        s = bytes(buf[pos : pos + n]).decode(errors="replace")
        pos += n
        return s

    def value(t: int):
        nonlocal pos
        if t == 8:
            return string()
        if t != 9:
            return take(_SCALAR[t])
        et, n = take("I"), take("Q")  # arrays (vocab, merges, ...): skipped, not decoded
        if et == 8:
            for _ in range(n):
                string()
        else:
            pos += n * struct.calcsize("<" + _SCALAR[et])
        return None

    try:
        if buf[:4] != b"GGUF":
            raise Fail(f"{path} is not a GGUF file")
        pos = 4
        take("I")
        n_t, n_kv = take("Q"), take("Q")
        kv = {}
        for _ in range(n_kv):
            k = string()
            kv[k] = value(take("I"))
        infos = []
        for _ in range(n_t):
            name = string()
            nd = take("I")
            for _ in range(nd):
                take("Q")
            take("I")
            infos.append((name, take("Q")))
    except (struct.error, KeyError) as e:
        raise Fail(f"{path}: unreadable GGUF header ({e})") from None
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()
    align = int(kv.get("general.alignment", 32))
    data_start = (pos + align - 1) // align * align
    arch = kv.get("general.architecture", "?")
    n_layer = int(kv.get(f"{arch}.block_count", 0))
    infos.sort(key=lambda x: x[1])
    nbytes = {}
    for i, (name, off) in enumerate(infos):
        end = infos[i + 1][1] if i + 1 < len(infos) else size - data_start
        nbytes[name] = end - off
    return {"arch": arch, "n_layer": n_layer, "tensor_bytes": nbytes, "file_bytes": size}


def expert_bytes_per_layer(layout: dict) -> list[int]:
    per = [0] * layout["n_layer"]
    for name, b in layout["tensor_bytes"].items():
        m = EXPS_RE.match(name)
        if m and int(m.group(1)) < len(per):
            per[int(m.group(1))] += b
    return per


# --------------------------------------------------------------------------------------------
# device memory sampling


class Sampler:
    """Peak device MiB above the idle baseline while a command runs; n/a without NVML."""

    name = "n/a"
    note = "no NVML (pynvml) and no nvidia-smi: peak device memory n/a"

    def used_mib(self) -> float | None:
        return None

    def measure(self, fn: Callable[[], object], interval: float = 0.02):
        """(fn(), peak MiB above the reading before fn ran); peak None if nothing was read."""
        base = self.used_mib()
        if base is None:
            return fn(), None
        peak, reads, stop = [base], [0], threading.Event()

        def loop():
            while not stop.is_set():
                v = self.used_mib()
                if v is not None:
                    reads[0] += 1
                    peak[0] = max(peak[0], v)
                stop.wait(interval)

        th = threading.Thread(target=loop, daemon=True)
        th.start()
        try:
            out = fn()
        finally:
            stop.set()
            th.join()
        return out, (peak[0] - base) if reads[0] else None


class NvmlSampler(Sampler):
    name = "NVML"
    note = "peak device MiB: NVML memory.used sampled every 20 ms, minus the idle baseline"

    def __init__(self, index: int = 0):
        import pynvml

        pynvml.nvmlInit()
        self._nv = pynvml
        self._h = pynvml.nvmlDeviceGetHandleByIndex(index)

    def used_mib(self) -> float | None:
        try:
            return self._nv.nvmlDeviceGetMemoryInfo(self._h).used / 2**20
        except self._nv.NVMLError:
            return None


class SmiSampler(Sampler):
    name = "nvidia-smi"
    note = "peak device MiB: nvidia-smi memory.used polled (~20 ms + its own latency), minus idle"

    def __init__(self, index: int = 0):
        self._cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        self._cmd.append(f"--id={index}")
        if self.used_mib() is None:
            raise OSError("nvidia-smi gave no reading")

    def used_mib(self) -> float | None:
        try:
            out = subprocess.run(self._cmd, capture_output=True, text=True, timeout=5)
            return float(out.stdout.split()[0]) if out.returncode == 0 else None
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return None


def make_sampler(cpu: bool) -> Sampler:
    if cpu:
        s = Sampler()
        s.note = "CPU build: no device memory to measure (peak MiB n/a)"
        return s
    for cls in (NvmlSampler, SmiSampler):
        try:
            return cls()
        except Exception:  # pynvml missing, no driver, no nvidia-smi: try the next
            continue
    return Sampler()


# --------------------------------------------------------------------------------------------
# llama-bench runs and their JSON


def parse_llama_bench_json(text: str) -> dict:
    """pp/tg tok/s (median, min, max of llama-bench's samples) from `llama-bench -o json`."""
    i = text.find("[")
    if i < 0:
        raise Fail("llama-bench printed no JSON")
    try:
        rows = json.loads(text[i:])
    except json.JSONDecodeError as e:
        raise Fail(f"llama-bench JSON unreadable ({e})") from None
    out: dict = {}
    for r in rows:
        ts = [float(x) for x in r.get("samples_ts") or [r["avg_ts"]]]
        rec = {
            "tps": statistics.median(ts),
            "tps_min": min(ts),
            "tps_max": max(ts),
            "avg_ts": float(r["avg_ts"]),
            "stddev_ts": float(r.get("stddev_ts", 0.0)),
            "n": int(r["n_prompt"] or r["n_gen"]),
        }
        key = "pp" if int(r["n_gen"]) == 0 else "tg" if int(r["n_prompt"]) == 0 else "pg"
        out[key] = rec
        out.setdefault(
            "info",
            {
                k: r.get(k)
                for k in (
                    "build_commit",
                    "build_number",
                    "backends",
                    "gpu_info",
                    "cpu_info",
                    "model_type",
                    "model_size",
                    "n_threads",
                    "n_gpu_layers",
                    "n_cpu_moe",
                    "flash_attn",
                )
                if k in r
            },
        )
    if "pp" not in out and "tg" not in out:
        raise Fail("llama-bench JSON has no pp or tg test")
    return out


def predict_n(per_layer: list[int], base_mib: float, budget_mib: float) -> int:
    """Smallest N whose predicted peak fits: experts of layers >= N on the card plus the base
    (what --cpu-moe, with no experts on the card, peaked at)."""
    L = len(per_layer)
    for n in range(L + 1):
        if base_mib + sum(per_layer[n:]) / 2**20 <= budget_mib:
            return n
    return L


def choose_n(
    per_layer: list[int],
    base_mib: float,
    budget_mib: float,
    probe: Callable[[int], float],
    known: dict[int, float] | None = None,
    max_probes: int = 8,
) -> tuple[int | None, dict[int, float]]:
    """Smallest --n-cpu-moe N whose probed peak fits the budget (None if even N = L does not).

    Starts at the byte-count prediction, walks up while a probe does not fit and down while the
    one below still fits; `known` peaks (all-GPU = 0, --cpu-moe = L) are not probed again.
    Returns (N, {N: peak MiB of every probe made})."""
    L = len(per_layer)
    known = dict(known or {})
    seen: dict[int, float] = {}

    def fits(n: int) -> bool:
        if n in known:
            return known[n] <= budget_mib
        if n not in seen:
            if len(seen) >= max_probes:
                raise Fail(f"no --n-cpu-moe settled after {max_probes} probes: {seen}")
            seen[n] = probe(n)
        return seen[n] <= budget_mib

    n = predict_n(per_layer, base_mib, budget_mib)
    while not fits(n):
        if n >= L:
            return None, seen
        n += 1
    while n > 0 and fits(n - 1):
        n -= 1
    return n, seen


# --------------------------------------------------------------------------------------------
# ratio table and report


def best_fitting(llama: list[dict]) -> dict | None:
    """The fastest-decoding --n-cpu-moe configuration (all-GPU is N = 0) that fits the budget;
    where no fit was measured at all (no NVML), the N chosen from GGUF bytes, marked so."""
    cand = [c for c in llama if c["kind"] in ("all-gpu", "n-cpu-moe") and c.get("tg")]
    ok = [c for c in cand if c.get("fits")]
    if not ok and all(c.get("fits") is None for c in cand):
        ok = [c for c in cand if c.get("chosen")]
    return max(ok, key=lambda c: c["tg"]["tps"]) if ok else None


def ratio_rows(llama: list[dict], strata: list[dict]) -> list[dict]:
    """Strata / llama.cpp for decode and prefill: hybrid arms against the best fitting
    --n-cpu-moe, all-cpu against --cpu-moe."""
    best = best_fitting(llama)
    cpu_moe = next((c for c in llama if c["kind"] == "cpu-moe" and c.get("tg")), None)
    all_gpu = next((c for c in llama if c["kind"] == "all-gpu" and c.get("tg")), None)
    by_arm = {r["arm"]: r for r in strata if "error" not in r}
    rows = []
    pairs = (("car-off", best), ("car-on", best), ("all-cpu", cpu_moe), ("all-gpu", all_gpu))
    for arm, peer in pairs:
        s = by_arm.get(arm)
        if not s or not peer:
            continue
        dec = s["decode_tps"] / peer["tg"]["tps"]
        pre = s["prefill_tps"] / peer["pp"]["tps"] if peer.get("pp") else None
        rows.append(
            {
                "strata_arm": arm,
                "llama_config": peer["label"],
                "strata_decode_tps": s["decode_tps"],
                "llama_decode_tps": peer["tg"]["tps"],
                "decode_ratio": dec,
                "strata_prefill_tps": s["prefill_tps"],
                "llama_prefill_tps": peer["pp"]["tps"] if peer.get("pp") else None,
                "prefill_ratio": pre,
                "goal": GOALS[arm],
                "meets_goal": dec >= GOALS[arm],
                "fit_measured": peer.get("fits") is not None,
            }
        )
    return rows


_YES_NO = {True: "yes", False: "no", None: "n/a"}


def fmt_num(v, fmt: str = "{:.1f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def render_markdown(doc: dict) -> str:
    m, s = doc["machine"], doc
    lines = [
        "# llama.cpp beside Strata, same GGUF, same budget",
        "",
        f"- machine: {m.get('gpu', 'no GPU')}; CPU {m['cpu']}, {m['cores']} cores",
        f"- commit: {s['commit']}; llama.cpp: {s.get('llama_build', '?')}; date: {s['date']}",
        f"- model: `{s['model']}` ({s['model_gib']:.2f} GiB, {s['n_layer']} layers, "
        f"{s['expert_gib']:.2f} GiB of experts)",
        f"- budget: {s['budget_mib']} MiB; -p {s['p']} -n {s['n']} -r {s['r']}; "
        f"{s['sampler_note']}",
        "",
        "## llama.cpp (`llama-bench`)",
        "",
        f"command: `{s['llama_command']}`",
        "",
        "| configuration | pp t/s | tg t/s (min-max) | peak MiB | fits |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for c in doc["llama"]:
        pp, tg = c.get("pp"), c.get("tg")
        tgs = f"{tg['tps']:.2f} ({tg['tps_min']:.2f}-{tg['tps_max']:.2f})" if tg else "n/a"
        lines.append(
            f"| {c['label']} | {fmt_num(pp and pp['tps'])} | {tgs} | "
            f"{fmt_num(c.get('peak_mib'), '{:.0f}')} | {_YES_NO[c.get('fits')]} |"
        )
    if doc.get("probes"):
        pr = ", ".join(f"N={k}: {fmt_num(v, '{:.0f}')} MiB" for k, v in doc["probes"].items())
        lines += ["", f"probes (-p {s['p']} -n 8 -r 1) for the smallest fitting N: {pr}"]
    lines += ["", "## Strata (`python -m strata.bench`)", ""]
    for c in doc.get("strata_commands", []):
        lines += [f"command: `{c}`"]
    lines += [
        "",
        "| arm | prefill t/s | decode t/s (min-max) | window ms (wait/route/pool) | hit % | CAR % "
        "| miss GB/s | peak MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in doc.get("strata", []):
        if "error" in r:
            lines.append(f"| {r['arm']} | error: {r['error']} | | | | | | |")
            continue
        keys = ("win_wait_ms", "win_route_ms", "win_pool_ms")
        split = "/".join(fmt_num(r.get(k), "{:.3f}") for k in keys)
        win = fmt_num(r.get("window_ms"), "{:.3f}")
        lines.append(
            f"| {r['arm']} | {r['prefill_tps']:.1f} | {r['decode_tps']:.2f} "
            f"({r['decode_tps_min']:.2f}-{r['decode_tps_max']:.2f}) | {win} "
            f"({split}) | {100 * r['hit_rate']:.1f} | {100 * r['car_substitution_rate']:.1f} "
            f"| {r['miss_expert_gbps']:.2f} | {fmt_num(r.get('peak_device_mib'), '{:.0f}')} |"
        )
    if doc.get("strata_peak_mib") is not None:
        lines += [
            "",
            f"Strata peak device MiB over all arms, sampled like llama.cpp's: "
            f"{doc['strata_peak_mib']:.0f}",
        ]
    lines += ["", "## Ratio (Strata / llama.cpp; the goal on decode per arm)", ""]
    lines += ["| Strata arm | llama.cpp peer | decode ratio | prefill ratio | goal |"]
    lines += ["| --- | --- | ---: | ---: | --- |"]
    for r in doc.get("ratios", []):
        lines.append(
            f"| {r['strata_arm']} ({r['strata_decode_tps']:.2f} t/s) | {r['llama_config']} "
            f"({r['llama_decode_tps']:.2f} t/s) | {r['decode_ratio']:.2f}x | "
            f"{fmt_num(r['prefill_ratio'], '{:.2f}x')} | "
            f"{'met' if r['meets_goal'] else 'not met'} (>= {r['goal']:g}x)"
            f"{'' if r['fit_measured'] else ' (fit not measured)'} |"
        )
    if not doc.get("ratios"):
        lines.append("| (no ratio: a side is missing) | | | | |")
    for n in doc.get("notes", []):
        lines.append(f"\nnote: {n}")
    return "\n".join(lines) + "\n"
