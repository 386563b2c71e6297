"""The `batched` step of scripts/llama_side_by_side.py: llama.cpp's `llama-batched-bench` and
`python -m strata.bench --arm batch` at the same batch sizes B on the same file, one report.

llama-batched-bench runs -npp P -ntg N -npl B1,B2,.. (each of the B sequences its own prompt,
N_KV = B (P + N)); its S_TG is the aggregate decode tokens/s of the B streams, S_TG / B one
stream's. Strata's batch arm reports the same two figures through the server's runner.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from llama_side_by_side_core import Fail, fmt_num


def batched_cmd(binary: Path, model: str, ns, sizes: list[int]) -> list[str]:
    p, n = ns.prompt_tokens, ns.gen_tokens
    cmd = [str(binary), "-m", model, "-ngl", "99", "-fa", "on", "-t", str(ns.threads)]
    cmd += ["-c", str(max(sizes) * (p + n)), "-b", "2048", "-ub", "512"]
    cmd += ["-npp", str(p), "-ntg", str(n), "-npl", ",".join(map(str, sizes))]
    cmd += ["--output-format", "jsonl"]
    if ns.batched_n_cpu_moe:
        cmd += ["--n-cpu-moe", str(ns.batched_n_cpu_moe)]
    return cmd


def parse_batched_jsonl(text: str) -> list[dict]:
    """llama-batched-bench's JSONL lines (other log lines skipped) -> one row per B."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "speed_tg" not in d or "pl" not in d:
            continue
        rows.append(
            {
                "batch": int(d["pl"]),
                "prompt_tokens": int(d["pp"]),
                "gen_tokens": int(d["tg"]),
                "prefill_tps": float(d["speed_pp"]),
                "decode_tps": float(d["speed_tg"]),
                "stream_tps": float(d["speed_tg"]) / int(d["pl"]),
                "n_gpu_layers": d.get("n_gpu_layers"),
                "n_threads": d.get("n_threads"),
            }
        )
    if not rows:
        raise Fail("llama-batched-bench printed no JSONL result rows")
    return rows


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise Fail(f"--batch-sizes: a comma list of integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise Fail(f"--batch-sizes: sizes >= 1, got {text!r}")
    return sizes


def strata_cmd(ns, model: str, sizes: list[int], out: Path, commit_id: str) -> list[str]:
    args = ["--arm", "batch", "--model", model, "--vram-budget-mib", str(ns.vram_budget_mib)]
    args += ["-p", str(ns.prompt_tokens), "-n", str(ns.gen_tokens), "-r", str(ns.repeats)]
    args += ["--batch-sizes", ",".join(map(str, sizes))]
    args += shlex.split(ns.strata_extra or "")
    args += ["--commit", commit_id, "--json", str(out)]
    return [sys.executable, "-m", "strata.bench", *args]


def ratio_rows(llama: list[dict], strata: list[dict]) -> list[dict]:
    """One row per B that both ran: aggregate and per-stream decode, and Strata / llama.cpp."""
    by_b = {r["batch"]: r for r in llama}
    out = []
    for s in strata:
        ll = by_b.get(s["batch"])
        if ll is None:
            continue
        out.append(
            {
                "batch": s["batch"],
                "llama_decode_tps": ll["decode_tps"],
                "llama_stream_tps": ll["stream_tps"],
                "strata_decode_tps": s["decode_tps"],
                "strata_stream_tps": s["stream_tps"],
                "ratio": s["decode_tps"] / ll["decode_tps"] if ll["decode_tps"] else None,
            }
        )
    return out


def render_markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        f"# Batched decode: llama.cpp llama-batched-bench vs Strata ({doc['date']})",
        "",
        f"- machine: {m.get('cpu')} ({m.get('cores')} cores)"
        + (f", {m['gpu']}" if m.get("gpu") else ""),
        f"- model: `{doc['model']}`; P = {doc['p']} prompt tokens, N = {doc['n']} generated a "
        f"stream; VRAM budget {doc['budget_mib']} MiB; Strata runner {doc['strata_runner']}",
        f"- commit {doc['commit']}",
        f"- llama.cpp: `{doc['llama_command']}`",
        f"- Strata: `{doc['strata_command']}`",
        "",
        "| B | llama.cpp t/s | llama.cpp per stream | Strata t/s | Strata per stream "
        "| Strata / llama.cpp |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["ratios"]:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        lines.append(
            f"| {r['batch']} | {fmt_num(r['llama_decode_tps'])} | "
            f"{fmt_num(r['llama_stream_tps'])} | {fmt_num(r['strata_decode_tps'])} | "
            f"{fmt_num(r['strata_stream_tps'])} | {ratio} |"
        )
    lines += ["", "t/s = decode tokens a second of all B streams together (llama.cpp's S_TG)."]
    return "\n".join(lines) + "\n"


def run_batched(ns, model: str, binary: Path, work: Path, env: dict, stamp: dict) -> dict:
    """Run both engines at the same B on `model` -> the report document (also written)."""
    if not binary.exists():
        raise Fail(f"no llama-batched-bench at {binary} (run the `build` and `wait` steps first)")
    sizes = parse_sizes(ns.batch_sizes)
    cmd = batched_cmd(binary, model, ns, sizes)
    print("llama_side_by_side: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise Fail(f"llama-batched-bench failed (exit {proc.returncode}): {tail}")
    llama = parse_batched_jsonl(proc.stdout + "\n" + proc.stderr)
    out = work / "strata-batch.json"
    out.unlink(missing_ok=True)
    scmd = strata_cmd(ns, model, sizes, out, stamp["commit"])
    print("llama_side_by_side: " + " ".join(scmd[1:]), file=sys.stderr)
    sproc = subprocess.run(scmd, cwd=Path(__file__).resolve().parent.parent)
    if not out.exists():
        raise Fail(f"python -m strata.bench failed (exit {sproc.returncode}) and wrote no JSON")
    res = next(r for r in json.loads(out.read_text())["results"] if r["arm"] == "batch")
    if "error" in res:
        raise Fail(f"strata.bench --arm batch: {res['error']}")
    doc = {
        **stamp,
        "model": model,
        "p": ns.prompt_tokens,
        "n": ns.gen_tokens,
        "r": ns.repeats,
        "budget_mib": ns.vram_budget_mib,
        "llama_command": " ".join([binary.name, *cmd[1:]]),
        "strata_command": "python -m strata.bench " + " ".join(scmd[3:-2]),
        "strata_runner": res.get("runner"),
        "llama": llama,
        "strata": res["batches"],
        "ratios": ratio_rows(llama, res["batches"]),
    }
    dest = Path(ns.out or os.environ.get("OUT") or work)
    dest.mkdir(parents=True, exist_ok=True)
    stem = dest / f"llama-batched-{stamp['date'].replace(':', '').replace('-', '')}"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    stem.with_suffix(".md").write_text(render_markdown(doc))
    print(render_markdown(doc))
    print(f"llama_side_by_side: wrote {stem}.md and .json")
    return doc
