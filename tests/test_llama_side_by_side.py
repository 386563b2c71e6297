"""scripts/llama_side_by_side.py: llama-bench JSON, the --n-cpu-moe choice, the ratio table and
the run step's bookkeeping, all without building llama.cpp or touching a GPU."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
FIXTURE = Path(__file__).parent / "fixtures" / "llama_bench_cpu_default.json"
FIXTURE_NCMOE = FIXTURE.with_name("llama_bench_cpu_default_ncmoe3.json")
MODEL = ROOT / "strata" / "data" / "default.gguf"
MIB = 2**20


@pytest.fixture
def core(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    import llama_side_by_side_core

    return llama_side_by_side_core


@pytest.fixture
def script(monkeypatch, core):
    import llama_side_by_side

    return llama_side_by_side


# ---- llama-bench JSON (real output of the CPU build on the embedded model) -------------------


@pytest.mark.parametrize(
    "fixture, n_cpu_moe, commit",
    [(FIXTURE, 0, "unknown"), (FIXTURE_NCMOE, 3, "llama-cpp-python-0.3.36")],
)
def test_parse_reads_pp_and_tg_medians_from_real_llama_bench_output(
    core, fixture, n_cpu_moe, commit
):
    res = core.parse_llama_bench_json(fixture.read_text())
    rows = json.loads(fixture.read_text())
    pp_row = next(r for r in rows if r["n_gen"] == 0)
    tg_row = next(r for r in rows if r["n_prompt"] == 0)
    assert res["pp"]["n"] == pp_row["n_prompt"] and res["tg"]["n"] == tg_row["n_gen"]
    for key, row in (("pp", pp_row), ("tg", tg_row)):
        r = res[key]
        assert r["tps_min"] <= r["tps"] <= r["tps_max"]
        assert r["tps"] == pytest.approx(statistics.median(row["samples_ts"]))
        assert r["tps_min"] == min(row["samples_ts"]) and r["avg_ts"] == row["avg_ts"]
    assert res["info"]["n_cpu_moe"] == n_cpu_moe and res["info"]["build_commit"] == commit
    assert res["info"]["backends"] == "CPU"


def test_parse_skips_text_before_the_json_array(core):
    res = core.parse_llama_bench_json("load log line\n" + FIXTURE.read_text())
    assert res["tg"]["tps"] > 0


@pytest.mark.parametrize("text", ["", "no json here", "[{broken", "[]"])
def test_parse_refuses_output_without_tests(core, text):
    with pytest.raises(core.Fail):
        core.parse_llama_bench_json(text)


# ---- GGUF layout ---------------------------------------------------------------------------


def test_gguf_expert_bytes_per_layer_match_the_gguf_reader(core):
    from gguf import GGUFReader

    layout = core.read_gguf_layout(MODEL)
    r = GGUFReader(MODEL)
    assert layout["arch"] == "qwen3moe" and layout["n_layer"] == 6
    want = [0] * 6
    for t in r.tensors:
        m = core.EXPS_RE.match(t.name)
        if m:
            want[int(m.group(1))] += int(t.n_bytes)
    assert core.expert_bytes_per_layer(layout) == want and all(want)


def test_gguf_reader_refuses_a_non_gguf_file(core, tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(core.Fail, match="not a GGUF"):
        core.read_gguf_layout(bad)


# ---- choosing N from a (fake) memory sampler ------------------------------------------------


def _fake_device(per_layer, base_mib, overhead_mib):
    """Peak MiB as llama.cpp would show it: base + experts left on the card + an overhead the
    byte count does not predict (compute buffers)."""
    calls = []

    def probe(n):
        calls.append(n)
        return base_mib + overhead_mib + sum(per_layer[n:]) / MIB

    return probe, calls


def _truth(per_layer, base_mib, overhead_mib, budget):
    return next(
        n
        for n in range(len(per_layer) + 1)
        if base_mib + overhead_mib + sum(per_layer[n:]) / MIB <= budget
    )


@pytest.mark.parametrize("overhead", [0.0, 150.0, 900.0, -400.0])
def test_choose_n_finds_the_smallest_fitting_n_with_few_probes(core, overhead):
    per = [230 * MIB] * 48  # Qwen3-30B-A3B IQ3_XXS: ~230 MiB of experts per layer
    base = 1800.0
    probe, calls = _fake_device(per, base, overhead)
    n, seen = core.choose_n(per, base, 10240, probe)
    assert n == _truth(per, base, overhead, 10240)
    assert probe(n) <= 10240 < probe(n - 1)
    assert len(calls) - 2 <= 6 and set(seen) == set(calls[:-2])


def test_choose_n_uses_known_peaks_without_probing_them(core):
    per = [100 * MIB] * 8
    probe, calls = _fake_device(per, 500.0, 0.0)
    known = {0: 1300.0, 8: 500.0}
    n, seen = core.choose_n(per, 500.0, 2000.0, probe, known)
    assert n == 0 and calls == [] and seen == {}


def test_choose_n_reports_none_when_even_all_experts_on_cpu_do_not_fit(core):
    per = [100 * MIB] * 4
    probe, _ = _fake_device(per, 3000.0, 0.0)
    n, _ = core.choose_n(per, 3000.0, 2048.0, probe, {4: 3000.0})
    assert n is None


def test_predict_n_counts_experts_of_the_layers_left_on_the_card(core):
    per = [100 * MIB, 200 * MIB, 300 * MIB]
    assert core.predict_n(per, 50.0, 650.0) == 0
    assert core.predict_n(per, 50.0, 649.0) == 1
    assert core.predict_n(per, 50.0, 550.0) == 1
    assert core.predict_n(per, 50.0, 549.0) == 2
    assert core.predict_n(per, 50.0, 349.0) == 3
    assert core.predict_n(per, 50.0, 10.0) == 3


def test_sampler_reports_peak_above_the_idle_baseline(core):
    class Fake(core.Sampler):
        def __init__(self):
            self.readings = iter([1000.0, 1000.0, 4500.0, 3000.0] + [1200.0] * 10_000)

        def used_mib(self):
            return next(self.readings)

    def work():
        import time

        time.sleep(0.2)
        return "done"

    out, peak = Fake().measure(work, interval=0.005)
    assert out == "done" and peak == 3500.0


def test_sampler_with_no_readings_during_the_run_says_n_a(core):
    class Flaky(core.Sampler):
        def __init__(self):
            self.first = True

        def used_mib(self):
            first, self.first = self.first, False
            return 500.0 if first else None

    assert Flaky().measure(lambda: 3, interval=0.001) == (3, None)


def test_make_sampler_prefers_nvml(core, monkeypatch):
    import types

    class NVMLError(Exception):
        pass

    used = iter([100 * MIB, 900 * MIB] + [300 * MIB] * 10_000)
    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=next(used)),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = core.make_sampler(cpu=False)
    assert s.name == "NVML"
    out, peak = s.measure(lambda: __import__("time").sleep(0.05), interval=0.001)
    assert peak == 800.0


def test_sampler_without_nvml_says_n_a(core):
    out, peak = core.Sampler().measure(lambda: 7)
    assert out == 7 and peak is None
    s = core.make_sampler(cpu=True)
    assert "n/a" in s.note and s.measure(lambda: 1)[1] is None


# ---- ratio table and report ---------------------------------------------------------------


def _cfg(kind, n, tg, pp, fits, peak=None):
    return {
        "kind": kind,
        "label": f"{kind} {n}",
        "n_cpu_moe": n,
        "pp": {"tps": pp, "tps_min": pp, "tps_max": pp},
        "tg": {"tps": tg, "tps_min": tg, "tps_max": tg},
        "peak_mib": peak,
        "fits": fits,
    }


def _arm(arm, dec, pre):
    return {
        "arm": arm,
        "decode_tps": dec,
        "decode_tps_min": dec,
        "decode_tps_max": dec,
        "prefill_tps": pre,
        "hit_rate": 0.5,
        "car_substitution_rate": 0.0,
        "miss_expert_gbps": 1.0,
    }


LLAMA = [
    _cfg("all-gpu", 0, 150.0, 3000.0, False, 13000),
    _cfg("cpu-moe", 48, 23.0, 400.0, True, 1900),
    _cfg("n-cpu-moe", 12, 60.0, 900.0, False, 10300),  # fastest, but over the budget
    _cfg("n-cpu-moe", 13, 40.0, 850.0, True, 10100),
    _cfg("n-cpu-moe", 14, 38.0, 840.0, True, 9900),
]
STRATA = [_arm("car-off", 60.0, 500.0), _arm("car-on", 100.0, 450.0), _arm("all-cpu", 46.0, 200)]


def test_ratios_use_the_best_fitting_n_cpu_moe_and_cpu_moe(core):
    rows = {r["strata_arm"]: r for r in core.ratio_rows(LLAMA, STRATA)}
    assert rows["car-off"]["llama_config"] == "n-cpu-moe 13"
    assert rows["car-off"]["decode_ratio"] == pytest.approx(1.5)
    assert rows["car-on"]["decode_ratio"] == pytest.approx(2.5) and rows["car-on"]["meets_goal"]
    assert not rows["car-off"]["meets_goal"]
    assert rows["all-cpu"]["llama_config"] == "cpu-moe 48"
    assert rows["all-cpu"]["decode_ratio"] == pytest.approx(2.0)
    assert rows["all-cpu"]["prefill_ratio"] == pytest.approx(0.5) and rows["all-cpu"]["meets_goal"]
    assert all(r["fit_measured"] for r in rows.values())
    # every expert on the card, against llama.cpp's all-GPU run: the goal there is 1.3x
    slow, fast = (core.ratio_rows(LLAMA, [_arm("all-gpu", d, 2000.0)])[0] for d in (180, 200))
    assert slow["llama_config"] == "all-gpu 0" and slow["goal"] == 1.3
    assert not slow["meets_goal"] and fast["meets_goal"]


def test_ratios_skip_failed_arms_and_unmeasured_fits_are_marked(core):
    unmeasured = [dict(c, fits=None, peak_mib=None) for c in LLAMA]
    unmeasured[2]["chosen"] = True  # the N predicted from GGUF bytes
    strata = [_arm("car-off", 80.0, 1.0), {"arm": "car-on", "error": "cache does not fit"}]
    rows = core.ratio_rows(unmeasured, strata)
    assert [r["strata_arm"] for r in rows] == ["car-off"]
    assert rows[0]["llama_config"] == "n-cpu-moe 12" and not rows[0]["fit_measured"]


def test_markdown_report_shows_both_engines_and_the_ratios(core):
    doc = {
        "machine": {"gpu": "NVIDIA H200, 143771 MiB", "cpu": "Xeon", "cores": 16},
        "commit": "abc1234",
        "date": "2026-11-29T16:00:00Z",
        "model": "/tmp/q3.gguf",
        "model_gib": 12.0,
        "expert_gib": 10.9,
        "n_layer": 48,
        "budget_mib": 10240,
        "p": 512,
        "n": 128,
        "r": 3,
        "sampler_note": "NVML",
        "llama_build": "deadbeef",
        "llama_command": "llama-bench -m /tmp/q3.gguf",
        "llama": LLAMA,
        "probes": {"13": 10100.0},
        "strata_commands": ["python -m strata.bench --arm car-off"],
        "strata": STRATA + [{"arm": "all-gpu", "error": "over budget"}],
        "strata_peak_mib": 9800.0,
        "notes": [],
    }
    doc["ratios"] = core.ratio_rows(doc["llama"], doc["strata"])
    md = core.render_markdown(doc)
    assert "| n-cpu-moe 12 | 900.0 | 60.00 (60.00-60.00) | 10300 | no |" in md
    assert (
        "| car-on (100.00 t/s) | n-cpu-moe 13 (40.00 t/s) | 2.50x | 0.53x | met (>= 2.5x) |" in md
    )
    assert "error: over budget" in md and "NVIDIA H200" in md and "abc1234" in md
    assert "python -m strata.bench --arm car-off" in md


# ---- the run step with a fake llama-bench --------------------------------------------------


def test_run_llama_part_probes_then_runs_n_and_extras(script, core, tmp_path, monkeypatch):
    layout = core.read_gguf_layout(MODEL)
    per = core.expert_bytes_per_layer(layout)
    parsed = core.parse_llama_bench_json(FIXTURE.read_text())
    base = 100.0

    def fake_run_llama(cmd, sampler, env):
        n = int(cmd[cmd.index("--n-cpu-moe") + 1]) if "--n-cpu-moe" in cmd else 0
        return parsed, base + sum(per[n:]) / MIB

    class Measured(core.Sampler):
        def used_mib(self):
            return 0.0

    monkeypatch.setattr(script, "run_llama", fake_run_llama)
    binary = tmp_path / "build-cuda" / "bin" / "llama-bench"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    budget = base + sum(per[3:]) / MIB + 0.5  # N = 3 is the smallest that fits
    ns = script.build_parser().parse_args(
        ["run", "--model", str(MODEL), "--work-dir", str(tmp_path)]
        + ["--vram-budget-mib", str(int(budget)), "-t", "4", "--extra-n", "1"]
    )
    res = script.run_llama_part(ns, str(MODEL), layout, Measured())
    labels = [c["label"] for c in res["configs"]]
    assert labels == ["all-GPU (-ngl 99)", "--cpu-moe (--n-cpu-moe 6)"] + [
        "--n-cpu-moe 3",
        "--n-cpu-moe 4",
    ]
    assert [c["fits"] for c in res["configs"]] == [False, True, True, True]
    assert set(res["probes"]) <= {"1", "2", "3", "4", "5"} and "3" in res["probes"]
    assert "-ngl 99 -fa 1 -t 4" in res["configs"][0]["cmd"]


def test_strata_rows_from_separate_calls_add_up(script):
    a = {"results": [_arm("car-off", 1, 1), _arm("car-on", 2, 2)], "peak_mib": 10.0}
    a["commands"] = ["first"]
    b = {"results": [_arm("car-on", 3, 3), _arm("all-cpu", 4, 4)], "peak_mib": None}
    m = script.merge_strata(a, dict(b, commands=["second"]))
    assert [(r["arm"], r["decode_tps"]) for r in m["results"]] == [
        ("car-off", 1),
        ("car-on", 3),
        ("all-cpu", 4),
    ]
    assert m["peak_mib"] == 10.0 and m["commands"] == ["first", "second"]


# ---- one-line refusals from the command line ------------------------------------------------


def _cli(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPTS / "llama_side_by_side.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args, reason",
    [
        (["run", "--model", "/nonexistent.gguf"], "model not found"),
        (["wait"], "no build started"),
        (["run", "--model", str(MODEL), "--n-cpu-moe", "2,x"], "wants integers"),
        (["run", "--model", str(MODEL), "--n-cpu-moe", "7"], "within 0..6"),
        (["build", "--cpu", "--archive", "/nonexistent.tar.xz"], "source archive"),
        (["run", "--synthetic", "tiny", "--routing-entropy", "0.9", "--skew", "0"], "give one"),
    ],
)
def test_steps_fail_with_one_line_reasons(args, reason, tmp_path):
    p = _cli(*args, "--work-dir", str(tmp_path))
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0] and lines[0].startswith("llama_side_by_side")
    assert list(tmp_path.iterdir()) == []


def test_run_refuses_without_a_built_llama_bench(tmp_path):
    p = _cli("run", "--part", "llama", "--model", str(MODEL), "--work-dir", str(tmp_path))
    assert p.returncode == 1 and "no llama-bench" in p.stderr
    assert not list(tmp_path.glob("part-*.json"))


@pytest.mark.skipif(
    not (shutil.which("cmake") and shutil.which("ninja")), reason="needs cmake and ninja"
)
def test_a_failing_build_reports_its_log_tail(tmp_path):
    src = tmp_path / "llama.cpp"
    src.mkdir()
    (src / "CMakeLists.txt").write_text('message(FATAL_ERROR "planted configure failure")\n')
    archive = tmp_path / "llama.cpp-src-test.tar.xz"
    with tarfile.open(archive, "w:xz") as tf:
        tf.add(src, arcname="llama.cpp")
    work = tmp_path / "work"
    p = _cli("build", "--cpu", "--archive", str(archive), "--work-dir", str(work))
    assert p.returncode == 1
    assert "planted configure failure" in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("llama_side_by_side: error: llama-bench")
    assert (work / "build-cpu.rc").read_text().strip() != "0"
