#!/usr/bin/env python3
"""llama.cpp (CUDA `llama-bench`) beside Strata on the same GGUF, VRAM budget and machine.

Steps (each usable alone, so they can be split across calls of at most 10 minutes):

  build   unpack .llama/llama.cpp-src-*.tar.xz (scripts/llama_src.sh) and build `llama-bench`
          and `llama-batched-bench`: CUDA for sm_90 by default, `--cpu` for a CPU-only build;
          `--background` returns at once
  wait    poll the build until the binary exists (or print the log tail and fail)
  run     llama-bench -ngl 99 -fa 1 -t T: all-GPU, --cpu-moe (= --n-cpu-moe <layers>) and
          --n-cpu-moe N for the smallest N whose measured peak device memory fits the budget
          (plus N+1.. N+extra), then `python -m strata.bench` on the same file; writes a
          markdown report + JSON with the ratio table (`--part llama|strata` runs one half and
          keeps it in the work dir; the report is written whenever both halves are there)
  batched llama-batched-bench -npp P -ntg N -npl B,.. and `python -m strata.bench --arm batch`
          at the same B (--batch-sizes, default 1,2,4,8,16) on the same file: one report
          (scripts/llama_batched.py)
  all     build + wait + run

Stdlib and strata.bench.common (itself stdlib only): it shells out to cmake/ninja, llama-bench and
`python -m strata.bench`.
Peak device memory comes from NVML (pynvml) or `nvidia-smi`, sampled every ~20 ms from a thread,
minus the idle baseline; where neither exists it is "n/a" and N is predicted from GGUF bytes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from llama_side_by_side_core import (
    EXPS_RE,
    Fail,
    Sampler,
    choose_n,
    expert_bytes_per_layer,
    fmt_num,
    make_sampler,
    parse_llama_bench_json,
    predict_n,
    ratio_rows,
    read_gguf_layout,
    render_markdown,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # strata.bench.common: the machine and commit stamps of every result
from strata.bench.common import commit, machine  # noqa: E402

PROG = "llama_side_by_side"
STRATA_ARMS = ("car-off", "car-on", "all-cpu")
BUILD_TARGETS = ("llama-bench", "llama-batched-bench")


# --------------------------------------------------------------------------------------------
# build / wait


def _work_dir(ns) -> Path:
    return Path(ns.work_dir or "/tmp/strata-llama")


def _kind(ns) -> str:
    return "cpu" if ns.cpu else "cuda"


def _paths(ns) -> dict[str, Path]:
    w, k = _work_dir(ns), _kind(ns)
    return {
        "work": w,
        "build": w / f"build-{k}",
        "log": w / f"build-{k}.log",
        "pid": w / f"build-{k}.pid",
        "rc": w / f"build-{k}.rc",
        "bin": w / f"build-{k}" / "bin" / "llama-bench",
        "batched_bin": w / f"build-{k}" / "bin" / "llama-batched-bench",
    }


def _archive(ns) -> Path:
    a = ns.archive
    if a:
        if not Path(a).is_file():
            raise Fail(f"no llama.cpp source archive at {a}")
        return Path(a)
    found = sorted(glob.glob(str(ROOT / ".llama" / "llama.cpp-src-*.tar.xz")))
    if not found:
        raise Fail("no .llama/llama.cpp-src-*.tar.xz (make it with scripts/llama_src.sh)")
    return Path(found[-1])


def _nvcc() -> str | None:
    """The toolkit's own nvcc (a PATH entry may be a wrapper script outside the toolkit)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for c in (home and f"{home}/bin/nvcc", "/usr/local/cuda/bin/nvcc", shutil.which("nvcc")):
        if c and os.access(c, os.X_OK):
            return os.path.realpath(c)
    return None


def _find_lib(names: tuple[str, ...], dirs: list[Path]) -> Path | None:
    for d in dirs:
        for n in names:
            hits = sorted(d.glob(n))
            if hits:
                return hits[0]
    return None


def _python_nvidia_dirs() -> list[Path]:
    """lib/ folders of the pip CUDA wheels (nvidia-cublas etc.) on python's path."""
    out = []
    for sp in sys.path:
        base = Path(sp) / "nvidia"
        if base.is_dir():
            out += [p for p in base.glob("*/lib") if p.is_dir()]
            out += [p for p in base.glob("*/*/lib") if p.is_dir()]
    return out


def cuda_cmake_args(nvcc: str, work: Path) -> tuple[list[str], list[str]]:
    """CMake args for a CUDA build, filling in cuBLAS/libcuda where the toolkit lacks them."""
    root = Path(nvcc).parent.parent
    tk = [root / "lib64", root / "lib", *root.glob("targets/*/lib")]
    args = [f"-DCMAKE_CUDA_COMPILER={nvcc}", "-DCMAKE_CUDA_ARCHITECTURES=90"]
    notes = []
    if not _find_lib(("libcublas.so",), tk):
        # pip-assembled toolkits ship no cuBLAS; torch's nvidia-cublas wheel does
        wheel = _python_nvidia_dirs()
        blas = _find_lib(("libcublas.so", "libcublas.so.*"), wheel)
        blaslt = _find_lib(("libcublasLt.so", "libcublasLt.so.*"), wheel)
        inc = blas.parent.parent / "include" if blas else None
        if not (blas and blaslt and inc and (inc / "cublas_v2.h").exists()):
            raise Fail(f"no cuBLAS in the CUDA toolkit at {root} nor in python's nvidia wheels")
        # only the cuBLAS headers: the wheel's other CUDA headers may not match the toolkit's
        shim = work / "cublas-include"
        shutil.rmtree(shim, ignore_errors=True)
        shim.mkdir(parents=True)
        for h in [*inc.glob("cublas*.h"), *inc.glob("nvblas*.h")]:
            (shim / h.name).symlink_to(h)
        args += [
            f"-DCUDA_cublas_LIBRARY={blas}",
            f"-DCUDA_cublasLt_LIBRARY={blaslt}",
            f"-DCMAKE_CUDA_FLAGS=-I{shim}",
            f"-DCMAKE_CXX_FLAGS=-I{shim}",
        ]
        notes.append(f"cuBLAS from {blas.parent}")
    if not _find_lib(("libcuda.so",), tk + [d / "stubs" for d in tk]):
        sysdirs = [Path("/usr/local/nvidia/lib64"), Path("/usr/lib/x86_64-linux-gnu")]
        drv = _find_lib(("libcuda.so", "libcuda.so.1"), sysdirs + [Path("/usr/lib64")])
        if drv:
            args.append(f"-DCUDA_cuda_driver_LIBRARY={drv}")
            notes.append(f"libcuda from {drv}")
        else:
            args.append("-DGGML_CUDA_NO_VMM=ON")  # no libcuda to link: legacy memory pool
            notes.append("no libcuda.so found: built with GGML_CUDA_NO_VMM")
    return args, notes


def cmake_configure_args(src: Path, build: Path, cpu: bool, version: str) -> list[str]:
    return [
        "cmake",
        "-S",
        str(src),
        "-B",
        str(build),
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_OPENSSL=OFF",  # no curl/https: models come from local files
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DGGML_NATIVE=ON",
        f"-DGGML_CUDA={'OFF' if cpu else 'ON'}",
        f"-DLLAMA_BUILD_COMMIT=llama-cpp-python-{version}",  # the archive has no .git
    ]


def step_build(ns) -> int:
    p = _paths(ns)
    built = p["bin"].exists() and p["batched_bin"].exists()
    if built and p["rc"].exists() and p["rc"].read_text().strip() == "0":
        print(f"{PROG}: llama-bench and llama-batched-bench already built in {p['bin'].parent}")
        return 0
    if p["pid"].exists() and not p["rc"].exists() and _alive(int(p["pid"].read_text())):
        raise Fail(f"a build is already running (pid {p['pid'].read_text()}); `wait` polls it")
    arc = _archive(ns)
    for tool in ("cmake", "ninja"):
        if not shutil.which(tool):
            raise Fail(f"{tool} not found on PATH")
    extra, notes = [], []
    if not ns.cpu:
        nvcc = _nvcc()
        if not nvcc:
            raise Fail("nvcc not found (PATH, /usr/local/cuda/bin); `build --cpu` builds without")
        extra, notes = cuda_cmake_args(nvcc, p["work"])
    m = re.search(r"llama\.cpp-src-(.+)\.tar\.xz$", arc.name)
    version = m.group(1) if m else "unknown"
    src_root = p["work"] / f"src-{version}"
    src = src_root / "llama.cpp"
    p["work"].mkdir(parents=True, exist_ok=True)
    if not (src / "CMakeLists.txt").exists():
        print(f"{PROG}: unpacking {arc.name} to {src_root}")
        tmp = src_root.with_name(src_root.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(arc) as tf:
            tf.extractall(tmp, filter="data")
        shutil.rmtree(src_root, ignore_errors=True)
        os.replace(tmp, src_root)
    for n in notes:
        print(f"{PROG}: note: {n}")
    jobs = ns.jobs or os.cpu_count() or 1
    conf = cmake_configure_args(src, p["build"], ns.cpu, version) + extra
    make = ["cmake", "--build", str(p["build"]), "--target", *BUILD_TARGETS, "-j", str(jobs)]
    script = f"{_sh(conf)} && {_sh(make)}; echo $? > {_sh([str(p['rc'])])}"
    p["rc"].unlink(missing_ok=True)
    print(
        f"{PROG}: building {' and '.join(BUILD_TARGETS)} ({_kind(ns)}, {jobs} jobs), log {p['log']}"
    )
    with open(p["log"], "w") as log:
        log.write(f"# {' '.join(conf)}\n# {' '.join(make)}\n")
        log.flush()
        proc = subprocess.Popen(
            ["bash", "-c", script],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # setsid: survives this process (and the calling shell)
        )
    p["pid"].write_text(str(proc.pid))
    if ns.background:
        print(f"{PROG}: started in the background (pid {proc.pid}); `wait` polls it")
        return 0
    return step_wait(ns)


def _sh(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as finished
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _log_tail(log: Path, n: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def step_wait(ns) -> int:
    p = _paths(ns)
    if not p["pid"].exists() and not p["rc"].exists():
        raise Fail(f"no build started in {p['work']} (run the `build` step first)")
    t0, last, shown = time.monotonic(), "", -1e9
    while True:
        if p["rc"].exists() and p["rc"].read_text().strip():
            rc = int(p["rc"].read_text().strip())
            if rc == 0 and p["bin"].exists() and p["batched_bin"].exists():
                print(f"{PROG}: built {p['bin']} in {p['work']}")
                return 0
            print(_log_tail(p["log"]), file=sys.stderr)
            raise Fail(f"llama-bench build failed (exit {rc}); log {p['log']}")
        pid = int(p["pid"].read_text()) if p["pid"].exists() else -1
        if pid > 0 and not _alive(pid) and not p["rc"].exists():
            print(_log_tail(p["log"]), file=sys.stderr)
            raise Fail(f"the build process {pid} died without a result; log {p['log']}")
        prog = _ninja_progress(p["log"])
        if prog and prog != last and time.monotonic() - shown >= 15:  # a line per 15 s at most
            print(f"{PROG}: build {prog} ({time.monotonic() - t0:.0f} s)", flush=True)
            last, shown = prog, time.monotonic()
        if ns.timeout and time.monotonic() - t0 > ns.timeout:
            raise Fail(f"build still running after {ns.timeout:.0f} s ({prog}); call `wait` again")
        time.sleep(1)


def _ninja_progress(log: Path) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    hits = re.findall(r"\[(\d+)/(\d+)\]", tail)
    return f"[{hits[-1][0]}/{hits[-1][1]}]" if hits else ""


def llama_cmd(binary: Path, model: str, ns, n_cpu_moe: int, p: int, n: int, r: int) -> list[str]:
    cmd = [str(binary), "-m", model, "-ngl", "99", "-fa", "1", "-t", str(ns.threads)]
    cmd += ["-p", str(p), "-n", str(n), "-r", str(r), "-o", "json"]
    if n_cpu_moe:
        cmd += ["--n-cpu-moe", str(n_cpu_moe)]
    return cmd


def run_llama(cmd: list[str], sampler: Sampler, env: dict) -> tuple[dict, float | None]:
    def go():
        return subprocess.run(cmd, capture_output=True, text=True, env=env)

    proc, peak = sampler.measure(go)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise Fail(f"llama-bench failed (exit {proc.returncode}): {tail}")
    return parse_llama_bench_json(proc.stdout), peak


# --------------------------------------------------------------------------------------------
# run


def _llama_env() -> dict:
    """The build's RUNPATH names cuBLAS's folder; LD_LIBRARY_PATH adds only a wheel's cuBLAS
    folder as a fallback (the wheel's other CUDA libraries must not shadow the toolkit's)."""
    env = dict(os.environ)
    extra = [str(d) for d in _python_nvidia_dirs() if list(d.glob("libcublas.so*"))]
    if extra:
        env["LD_LIBRARY_PATH"] = ":".join(extra + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    return env


def _say(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def _given_n(text: str, n_layer: int) -> list[int]:
    try:
        picks = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise Fail(f"--n-cpu-moe wants integers, comma-separated: {text!r}") from None
    if not all(0 <= n <= n_layer for n in picks):
        raise Fail(f"--n-cpu-moe values must be within 0..{n_layer} (the model's layers)")
    return picks


def run_llama_part(ns, model: str, layout: dict, sampler: Sampler) -> dict:
    p = _paths(ns)
    if not p["bin"].exists():
        raise Fail(f"no llama-bench at {p['bin']} (run the `build` and `wait` steps first)")
    env = _llama_env()
    L = layout["n_layer"]
    per = expert_bytes_per_layer(layout)
    if not any(per):
        raise Fail(f"{model}: no expert tensors (blk.N.ffn_*_exps) found: not an MoE GGUF")
    B = ns.vram_budget_mib
    configs: list[dict] = []
    notes: list[str] = [sampler.note]

    def full(kind: str, label: str, ncm: int) -> dict:
        cmd = llama_cmd(p["bin"], model, ns, ncm, ns.prompt_tokens, ns.gen_tokens, ns.repeats)
        _say(f"[{len(configs) + 1}] llama-bench {label}")
        res, peak = run_llama(cmd, sampler, env)
        fits = None if peak is None else peak <= B
        c = {"kind": kind, "label": label, "n_cpu_moe": ncm, "cmd": " ".join(cmd), **res}
        c.update(peak_mib=peak, fits=fits)
        configs.append(c)
        pp, tg = res.get("pp", {}).get("tps"), res.get("tg", {}).get("tps")
        _say(f"    pp {fmt_num(pp)} t/s, tg {fmt_num(tg)} t/s, peak {fmt_num(peak, '{:.0f}')} MiB")
        return c

    ag = full("all-gpu", "all-GPU (-ngl 99)", 0)
    cm = full("cpu-moe", f"--cpu-moe (--n-cpu-moe {L})", L)
    probes: dict[int, float] = {}
    if ns.n_cpu_moe:
        picks = _given_n(ns.n_cpu_moe, L)
        notes.append(f"--n-cpu-moe given: {picks} (no selection)")
    elif cm["peak_mib"] is None:
        base = sum(b for n, b in layout["tensor_bytes"].items() if not EXPS_RE.match(n)) / 2**20
        n0 = predict_n(per, base, B)
        picks = [n0]
        notes.append(
            f"no device memory readings: N={n0} predicted from GGUF bytes (non-expert "
            f"{base:.0f} MiB + experts of layers >= N <= {B} MiB); fit not measured"
        )
    else:

        def probe(n: int) -> float:
            cmd = llama_cmd(p["bin"], model, ns, n, ns.prompt_tokens, 8, 1)
            _say(f"    probe --n-cpu-moe {n}")
            peak = run_llama(cmd, sampler, env)[1]
            if peak is None:
                raise Fail(f"no device memory reading during the --n-cpu-moe {n} probe")
            return peak

        known = {0: ag["peak_mib"], L: cm["peak_mib"]}
        n_star, probes = choose_n(per, cm["peak_mib"], B, probe, known)
        if n_star is None:
            raise Fail(
                f"no --n-cpu-moe N fits {B} MiB: with every expert on the CPU llama.cpp peaks at "
                f"{cm['peak_mib']:.0f} MiB"
            )
        picks = [n for n in range(n_star, n_star + ns.extra_n + 1) if n <= L]
    for n in picks:
        if n in (0, L):  # all-GPU and --cpu-moe, already run
            (ag if n == 0 else cm)["chosen"] = True
            continue
        full("n-cpu-moe", f"--n-cpu-moe {n}", n)["chosen"] = True
    info = next((c["info"] for c in configs if c.get("info")), {})
    return {
        "configs": configs,
        "probes": {str(k): v for k, v in sorted(probes.items())},
        "notes": notes,
        "llama_build": f"{info.get('build_commit', '?')} (build {info.get('build_number', '?')}"
        f", {info.get('backends', '?')})",
        "llama_command": " ".join(
            llama_cmd(
                Path("llama-bench"), model, ns, 0, ns.prompt_tokens, ns.gen_tokens, ns.repeats
            )
        )
        + " [--n-cpu-moe N]",
    }


def run_strata_part(ns, model: str, sampler: Sampler) -> dict:
    out = _work_dir(ns) / "strata-bench.json"
    out.unlink(missing_ok=True)
    args = [a for arm in ns.strata_arm for a in ("--arm", arm)]
    args += ["--model", model, "--vram-budget-mib", str(ns.vram_budget_mib)]
    args += ["-p", str(ns.prompt_tokens), "-n", str(ns.gen_tokens), "-r", str(ns.repeats)]
    args += ["--shift"] if ns.shift else []
    args += shlex.split(ns.strata_extra or "")
    args += ["--commit", ns.commit or commit(), "--json", str(out)]
    cmd = [sys.executable, "-m", "strata.bench", *args]
    _say("python -m strata.bench " + " ".join(args))
    proc, peak = sampler.measure(lambda: subprocess.run(cmd, cwd=ROOT))
    if not out.exists():
        raise Fail(f"python -m strata.bench failed (exit {proc.returncode}) and wrote no JSON")
    doc = json.loads(out.read_text())
    return {
        "results": doc["results"],
        "peak_mib": peak,
        "commands": ["python -m strata.bench " + " ".join(args[:-1] + ["PATH"])],
    }


def merge_strata(old: dict, new: dict) -> dict:
    """Arms run in separate calls (--strata-arm) add up; a re-run arm replaces its old row."""
    if not old:
        return new
    arms = {r["arm"] for r in new["results"]}
    keep = [r for r in old["results"] if r["arm"] not in arms]
    peaks = [p for p in (old.get("peak_mib"), new["peak_mib"]) if p is not None]
    return {
        "results": keep + new["results"],
        "peak_mib": max(peaks) if peaks else None,
        "commands": old.get("commands", []) + new["commands"],
    }


def _key(ns, model: str) -> dict:
    st = os.stat(model)
    return {
        "model": os.path.abspath(model),
        "model_bytes": st.st_size,
        "budget_mib": ns.vram_budget_mib,
        "p": ns.prompt_tokens,
        "n": ns.gen_tokens,
        "r": ns.repeats,
        "shift": ns.shift,
    }


def _synthetic(ns) -> str:
    """--synthetic: the model file, written once into the work dir (strata.bench's cache)."""
    from strata.bench.__main__ import BENCH_ROUTING_ENTROPY
    from strata.bench.common import synthetic_model

    if ns.routing_entropy is not None and ns.skew is not None:
        raise Fail("--routing-entropy and --skew are two choices of routing: give one")
    entropy = ns.routing_entropy
    if entropy is None and ns.skew is None:
        entropy = BENCH_ROUTING_ENTROPY
    path = synthetic_model(
        ns.synthetic, ns.quant, ns.skew or 0.0, cache_dir=_work_dir(ns), routing_entropy=entropy
    )
    return str(path)


def step_run(ns) -> int:
    model = _synthetic(ns) if ns.synthetic else ns.model
    if not model or not Path(model).is_file():
        raise Fail(f"model not found: {model}")
    layout = read_gguf_layout(model)
    if layout["n_layer"] <= 0:
        raise Fail(f"{model}: no {layout['arch']}.block_count in the GGUF metadata")
    if ns.n_cpu_moe:
        _given_n(ns.n_cpu_moe, layout["n_layer"])  # refuse before any run
    sampler = make_sampler(ns.cpu)
    work = _work_dir(ns)
    work.mkdir(parents=True, exist_ok=True)
    key = _key(ns, model)
    parts = {}
    for part in ("llama", "strata"):
        f = work / f"part-{part}.json"
        old = json.loads(f.read_text()) if f.exists() else {}
        old = old if old.get("key") == key else {}
        if ns.part in (part, "both"):
            if part == "llama":
                res = run_llama_part(ns, model, layout, sampler)
            else:
                res = merge_strata(old, run_strata_part(ns, model, sampler))
            old = {"key": key, **res}
            f.with_suffix(".partial").write_text(json.dumps(old, indent=1))
            os.replace(f.with_suffix(".partial"), f)
        if old:
            parts[part] = old
    if "llama" not in parts or "strata" not in parts:
        miss = "llama" if "llama" not in parts else "strata"
        print(f"{PROG}: saved; report waits for the {miss} part (run --part {miss})")
        return 0
    return write_report(ns, model, layout, sampler, parts)


def write_report(ns, model: str, layout: dict, sampler: Sampler, parts: dict) -> int:
    per = expert_bytes_per_layer(layout)
    ll, st = parts["llama"], parts["strata"]
    now = _dt.datetime.now(_dt.UTC)
    doc = {
        "machine": machine(),
        "commit": ns.commit or commit(),
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "model": model,
        "model_gib": layout["file_bytes"] / 2**30,
        "expert_gib": sum(per) / 2**30,
        "n_layer": layout["n_layer"],
        "budget_mib": ns.vram_budget_mib,
        "p": ns.prompt_tokens,
        "n": ns.gen_tokens,
        "r": ns.repeats,
        "sampler_note": sampler.note,
        "llama_build": ll["llama_build"],
        "llama_command": ll["llama_command"],
        "llama": ll["configs"],
        "probes": ll["probes"],
        "strata_commands": st["commands"],
        "strata": st["results"],
        "strata_peak_mib": st["peak_mib"],
        "notes": ll["notes"][1:],
    }
    doc["ratios"] = ratio_rows(doc["llama"], doc["strata"])
    out = Path(ns.out or os.environ.get("OUT") or ROOT / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    stem = f"llama-side-by-side-{now.strftime('%Y%m%dT%H%MZ')}"
    for suffix, text in ((".json", json.dumps(doc, indent=1)), (".md", render_markdown(doc))):
        tmp = out / (stem + suffix + ".partial")
        tmp.write_text(text)
        os.replace(tmp, out / (stem + suffix))
    print(render_markdown(doc))
    print(f"{PROG}: wrote {out / stem}.md and .json")
    return 0


def step_batched(ns) -> int:
    from llama_batched import run_batched

    model = _synthetic(ns) if ns.synthetic else ns.model
    if not model or not Path(model).is_file():
        raise Fail(f"model not found: {model}")
    work = _work_dir(ns)
    work.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    stamp = {"machine": machine(), "commit": ns.commit or commit(), "date": now}
    run_batched(ns, model, _paths(ns)["batched_bin"], work, _llama_env(), stamp)
    return 0


# --------------------------------------------------------------------------------------------
# CLI


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="scripts/llama_side_by_side.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="step", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cpu", action="store_true", help="CPU-only llama.cpp build (no CUDA)")
    common.add_argument("--work-dir", default=None, help="build + state dir (/tmp/strata-llama)")
    b = argparse.ArgumentParser(add_help=False)
    b.add_argument("--archive", default=None, help="source archive (.llama/llama.cpp-src-*)")
    b.add_argument("--jobs", type=int, default=0, help="build jobs (0 = all cores)")
    b.add_argument("--background", action="store_true", help="start the build and return")
    w = argparse.ArgumentParser(add_help=False)
    w.add_argument("--timeout", type=float, default=540.0, help="seconds to wait (0 = no limit)")
    r = argparse.ArgumentParser(add_help=False)
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="GGUF file (the same for both engines)")
    src.add_argument(
        "--synthetic", metavar="SHAPE", help="a synthetic model (written once into --work-dir)"
    )
    r.add_argument("--quant", default="Q4_K", help="--synthetic: expert quant")
    r.add_argument(
        "--routing-entropy",
        type=float,
        default=None,
        help="--synthetic: normalized usage entropy of its routing (default 0.93 unless --skew)",
    )
    r.add_argument(
        "--skew", type=float, default=None, help="--synthetic: skew instead (0: uniform)"
    )
    r.add_argument(
        "--shift",
        action="store_true",
        help="Strata places its cache by a calibration prompt from one half of the vocabulary "
        "and is measured on the other (python -m strata.bench --shift)",
    )
    r.add_argument("--vram-budget-mib", type=int, default=10240)
    r.add_argument("-p", "--prompt-tokens", type=int, default=512)
    r.add_argument("-n", "--gen-tokens", type=int, default=128)
    r.add_argument("-r", "--repeats", type=int, default=3)
    r.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    r.add_argument("--extra-n", type=int, default=2, help="also run N+1..N+extra")
    r.add_argument("--n-cpu-moe", default=None, help="run these N (comma list), no selection")
    r.add_argument("--part", choices=("both", "llama", "strata"), default="both")
    r.add_argument(
        "--strata-arm", action="append", default=None, help=f"default: {', '.join(STRATA_ARMS)}"
    )
    r.add_argument("--strata-extra", default=None, help="more strata.bench flags, one string")
    r.add_argument("--out", default=None, help="report folder (default $OUT, else bench/results)")
    r.add_argument(
        "--commit", default=None, help="commit stamped on both halves (default: git's HEAD)"
    )
    sub.add_parser("build", parents=[common, b, w], help="unpack and build llama-bench")
    sub.add_parser("wait", parents=[common, w], help="wait for the build")
    sub.add_parser("run", parents=[common, r], help="run both engines and write the report")
    sub.add_parser("all", parents=[common, b, w, r], help="build + wait + run")
    bb = sub.add_parser(
        "batched", parents=[common, r], help="llama-batched-bench and strata's batch arm"
    )
    bb.add_argument("--batch-sizes", default="1,2,4,8,16", help="the batch sizes B (comma list)")
    bb.add_argument(
        "--batched-n-cpu-moe",
        type=int,
        default=0,
        metavar="N",
        help="llama.cpp: experts of the first N layers on the CPU (the budget's N from `run`)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if getattr(ns, "strata_arm", "x") is None:
        ns.strata_arm = list(STRATA_ARMS)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if ns.step == "build":
            return step_build(ns)
        if ns.step == "wait":
            return step_wait(ns)
        if ns.step == "run":
            return step_run(ns)
        if ns.step == "batched":
            return step_batched(ns)
        ns.background = False
        step_build(ns)
        return step_run(ns)
    except Fail as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
