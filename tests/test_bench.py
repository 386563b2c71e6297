"""`python -m strata.bench`: arms run end to end and report what they promise."""

from __future__ import annotations

import json

import pytest

from strata.bench.__main__ import main


def test_engine_arms_report_speed_hits_and_car(tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = main(
        [
            "--arm",
            "car-off",
            "--arm",
            "car-on",
            "-p",
            "8",
            "-n",
            "6",
            "-r",
            "1",
            "--expert-cache",
            "24",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["stamp"]["commit"] and doc["stamp"]["machine"]["cores"] >= 1
    off, on = doc["results"]
    for r in (off, on):
        assert r["decode_tps"] > 0 and r["prefill_tps"] > 0 and 0 < r["hit_rate"] < 1
        assert r["resident_experts"] == 24
    assert off["car_substitution_rate"] == 0.0 and on["car_substitution_rate"] > 0.0
    out = capsys.readouterr().out
    assert "decode t/s" in out and "% of host read" in out
    assert "CPU experts a decode layer-window" in out
    assert all(0 < r["cpu_experts_per_window"] <= 8 and r["helpers"] == [] for r in (off, on))
    assert doc["bandwidth"]["host_read_gbps"] > 0  # the ceiling, measured in the same run
    assert all(r["tier_weight_gbps"] > 0 for r in (off, on))


def test_car_quality_reports_ppl_kl_agreement_and_generation(tmp_path, capsys):
    out = tmp_path / "q.json"
    argv = ["--arm", "car-quality", "--max-tokens", "24", "-n", "3", "--residency", "0.33",
            "--thresholds", "0.05,1.0", "--prompts", "3", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    res = json.loads(out.read_text())["results"][0]
    assert res["tokens"] == 24 and res["prompts"] == 3 and res["slack_jobs"] == 67 / 30
    (r,) = res["residencies"]
    rows = r["rows"]
    assert list(rows) == ["off", "ratio 0.05", "ratio 1", "slack"]
    on, off = rows["ratio 0.05"], rows["off"]
    assert on["substitution_rate"] > 0 and on["mean_kl"] > 0 and on["substituted_mass"] > 0
    # threshold 1.0 is CAR off: identical to the reference run, generation included
    same = rows["ratio 1"]
    assert same["substitution_rate"] == 0 and same["mean_kl"] == 0 and same["ppl"] == off["ppl"]
    assert same["top1_agreement"] == 1 and same["generation_identical"] == 1
    # the slack rule substitutes less than the seeds' rule at a lower threshold
    assert rows["slack"]["substitution_rate"] <= on["substitution_rate"]
    assert "gen same" in capsys.readouterr().out


def test_bad_arm_input_is_a_one_line_error(capsys):
    argv = ["--arm", "car-on", "-n", "2", "-p", "2", "-r", "1", "--commit", "abc1234"]
    assert main(argv) == 2  # all fits: no pool
    out, err = capsys.readouterr()
    # (a once-per-process "no GPU tier" notice may precede it)
    err = [ln for ln in err.strip().splitlines() if not ln.startswith("strata: no GPU tier")]
    assert len(err) == 1 and err[0].startswith("strata.bench: error:")
    assert "| commit abc1234 |" in out  # --commit stamps the results


def test_synthetic_models_are_cached_in_cache_dir(tmp_path):
    from strata.bench.__main__ import _model_path, build_parser

    argv = ["--arm", "car-off", "--synthetic", "tiny", "--cache-dir", str(tmp_path)]
    path = _model_path(build_parser().parse_args(argv))
    assert path.is_file() and path.parent == tmp_path / "synth"
    assert _model_path(build_parser().parse_args(argv)) == path  # written once, then reused


def test_repeats_below_one_are_refused():
    with pytest.raises(SystemExit) as e:
        main(["--arm", "cpu-pool", "-r", "0"])
    assert e.value.code == 2


def test_engine_arm_prefill_once_and_calibrated_placement(tmp_path):
    out = tmp_path / "b.json"
    argv = ["--arm", "car-off", "-p", "12", "-n", "4", "-r", "2", "--expert-cache", "24"]
    rc = main(argv + ["--prefill-once", "--calibrate", "--json", str(out)])
    assert rc == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["prefill_once"] and r["calibrated_placement"]
    assert r["resident_experts"] == 24 and 0 < r["hit_rate"] < 1
    assert r["decode_tps_min"] <= r["decode_tps"] <= r["decode_tps_max"]


def test_engine_arms_run_with_the_servers_engine_defaults(tmp_path):
    from strata.bench.engine_arms import ARMS
    from strata.config import EngineConfig
    from strata.routing.car import DEFAULT_THRESHOLD

    assert ARMS["car-on"]["car_threshold"] == DEFAULT_THRESHOLD
    out = tmp_path / "b.json"
    argv = ["--arm", "car-off", "-p", "8", "-n", "4", "-r", "1", "--expert-cache", "24"]
    assert main(argv + ["--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["adapt_swaps_per_request"] == EngineConfig().adapt_swaps > 0  # not a static cache
    assert 0 < r["decode_usage_entropy"] <= 1


def test_synthetic_models_default_to_routing_entropy_and_skew_is_the_other_choice(tmp_path):
    from strata.bench.__main__ import _model_path, build_parser

    base = ["--arm", "car-off", "--synthetic", "tiny", "--cache-dir", str(tmp_path)]
    assert "-H0.93-" in _model_path(build_parser().parse_args(base)).name
    assert "-skew0-" in _model_path(build_parser().parse_args(base + ["--skew", "0"])).name
    with pytest.raises(SystemExit):
        main(base + ["--skew", "0", "--routing-entropy", "0.9"])


def test_shift_calibrates_on_one_half_of_the_vocabulary_and_measures_on_the_other(tmp_path):
    from strata.bench.engine_arms import token_ranges

    assert token_ranges(100, False) == ((0, 100), (0, 100))
    assert token_ranges(100, True) == ((0, 50), (50, 100))
    out = tmp_path / "b.json"
    argv = ["--arm", "car-off", "-p", "8", "-n", "4", "-r", "1", "--expert-cache", "24"]
    assert main(argv + ["--shift", "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["shift"] and r["calibrated_placement"] and 0 < r["hit_rate"] < 1
