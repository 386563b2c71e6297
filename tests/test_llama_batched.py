"""scripts/llama_side_by_side.py's `batched` step (scripts/llama_batched.py): llama-batched-bench's
command and JSONL, the report beside `python -m strata.bench --arm batch`, without building
llama.cpp (a stand-in binary prints llama-batched-bench's JSONL)."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
MODEL = ROOT / "strata" / "data" / "default.gguf"

# llama-batched-bench --output-format jsonl (the format of tools/batched-bench/batched-bench.cpp)
ROW = (
    '{{"n_kv_max": 2048, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 1, "is_pp_shared": 0, '
    '"n_gpu_layers": 99, "n_threads": 2, "n_threads_batch": 2, "pp": {pp}, "tg": {tg}, '
    '"pl": {pl}, "n_kv": {kv}, "t_pp": 0.1, "speed_pp": {spp}, "t_tg": 1.0, "speed_tg": {stg}, '
    '"t": 1.1, "speed": 100.0}}'
)


def _row(pl: int, stg: float, pp: int = 16, tg: int = 8) -> str:
    return ROW.format(pp=pp, tg=tg, pl=pl, kv=pl * (pp + tg), spp=500.0 * pl, stg=stg)


@pytest.fixture
def lb(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import llama_batched

    return llama_batched


def _ns(**kw) -> Namespace:
    base = dict(
        prompt_tokens=16,
        gen_tokens=8,
        repeats=1,
        threads=2,
        batched_n_cpu_moe=0,
        vram_budget_mib=10240,
        strata_extra=None,
        batch_sizes="1,2",
        out=None,
    )
    return Namespace(**{**base, **kw})


def test_batched_cmd_runs_every_b_with_room_for_the_largest(lb):
    cmd = lb.batched_cmd(Path("/x/llama-batched-bench"), "m.gguf", _ns(), [1, 2, 4, 8, 16])
    args = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert args["-npl"] == "1,2,4,8,16" and args["-npp"] == "16" and args["-ntg"] == "8"
    assert args["-c"] == str(16 * (16 + 8)) and args["--output-format"] == "jsonl"
    assert "--n-cpu-moe" not in cmd
    cmd = lb.batched_cmd(Path("b"), "m.gguf", _ns(batched_n_cpu_moe=24), [8])
    assert cmd[cmd.index("--n-cpu-moe") + 1] == "24"


def test_jsonl_rows_give_aggregate_and_per_stream_decode(lb):
    text = "\n".join(["main: n_kv_max = 2048", _row(1, 40.0), "", _row(4, 120.0), "llama_perf"])
    rows = lb.parse_batched_jsonl(text)
    assert [r["batch"] for r in rows] == [1, 4]
    assert rows[1]["decode_tps"] == 120.0 and rows[1]["stream_tps"] == 30.0
    assert rows[0]["prompt_tokens"] == 16 and rows[0]["gen_tokens"] == 8


@pytest.mark.parametrize("text", ["", "no rows\n{broken", '{"pl": 1}'])
def test_jsonl_without_result_rows_is_refused(lb, text):
    with pytest.raises(lb.Fail):
        lb.parse_batched_jsonl(text)


@pytest.mark.parametrize("text", ["", "1,x", "0,2"])
def test_batch_sizes_are_positive_integers(lb, text):
    with pytest.raises(lb.Fail):
        lb.parse_sizes(text)


def test_ratios_pair_the_same_b_and_the_report_shows_them(lb):
    llama = lb.parse_batched_jsonl("\n".join([_row(1, 40.0), _row(2, 60.0), _row(8, 200.0)]))
    strata = [
        {"batch": 1, "decode_tps": 50.0, "stream_tps": 50.0},
        {"batch": 2, "decode_tps": 90.0, "stream_tps": 45.0},
        {"batch": 4, "decode_tps": 150.0, "stream_tps": 37.5},
    ]
    rows = lb.ratio_rows(llama, strata)
    assert [r["batch"] for r in rows] == [1, 2]
    assert rows[1]["ratio"] == pytest.approx(1.5) and rows[1]["llama_stream_tps"] == 30.0
    doc = {
        "date": "2026-12-08T00:00:00Z",
        "machine": {"cpu": "EPYC", "cores": 2},
        "model": "m.gguf",
        "p": 16,
        "n": 8,
        "budget_mib": 10240,
        "strata_runner": "EngineRunner",
        "commit": "abc",
        "llama_command": "llama-batched-bench -m m.gguf",
        "strata_command": "python -m strata.bench --arm batch",
        "ratios": rows,
    }
    md = lb.render_markdown(doc)
    assert "| 2 | 60.0 | 30.0 | 90.0 | 45.0 | 1.50x |" in md


def test_the_batched_step_refuses_without_a_built_binary(tmp_path):
    p = subprocess.run(
        [sys.executable, str(SCRIPTS / "llama_side_by_side.py"), "batched", "--cpu"]
        + ["--model", str(MODEL), "--work-dir", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 1 and "no llama-batched-bench" in p.stderr


def test_the_batched_step_writes_one_report_of_both_engines(tmp_path):
    """A stand-in llama-batched-bench; the real `python -m strata.bench --arm batch` at B = 1, 2."""
    binary = tmp_path / "build-cpu" / "bin" / "llama-batched-bench"
    binary.parent.mkdir(parents=True)
    rows = "\\n".join(_row(b, 40.0 * b).replace("'", "") for b in (1, 2))
    binary.write_text(f"#!/bin/sh\necho 'loading'\nprintf '{rows}\\n'\n")
    binary.chmod(0o755)
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, str(SCRIPTS / "llama_side_by_side.py"), "batched", "--cpu"]
        + ["--model", str(MODEL), "--work-dir", str(tmp_path), "--out", str(out)]
        + ["-p", "16", "-n", "8", "-r", "1", "--batch-sizes", "1,2", "--commit", "test"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    (report,) = out.glob("llama-batched-*.json")
    doc = json.loads(report.read_text())
    assert [r["batch"] for r in doc["ratios"]] == [1, 2]
    assert doc["strata_runner"] == "EngineRunner" and doc["commit"] == "test"
    for r in doc["ratios"]:
        assert r["strata_decode_tps"] > 0 and r["llama_decode_tps"] == 40.0 * r["batch"]
    assert report.with_suffix(".md").exists()
